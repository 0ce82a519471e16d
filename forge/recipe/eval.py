"""Recipe schema: the `eval:` block (the suite run on the starting checkpoint, each
stage's output and the Novella), its gates, and the metric that decides the champion.

Metric names the suite produces (forge.eval.suite): `ppl.<source>` / `loss.<source>` (held-out),
`retention.<source>` (general sources: relative perplexity increase over the starting checkpoint),
`domain_gain.<source>` (domain sources: relative perplexity decrease), `fact_recall.exact` /
`fact_recall.contains` (with a split_field: `fact_recall.<split>.exact`, e.g. `fact_recall.heldout.exact`;
a complete_splits split's figures score sentence completions),
`instruct.accuracy` / `instruct.contains`, `preference_accuracy`, `reward.mean` (weighted total) and
`reward.<source>.mean` per reward source, `<function>.<key>` for custom evaluators,
`lm_eval.<task>.<metric>`, `llm_judge.<rubric>.mean` / `.std` (an LLM judge's grades, forge.recipe.judge)
and `gen_qa.exact_match` / `gen_qa.f1` / `gen_qa.rouge_l` (generated answers against references).
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from forge.recipe.data import NAME, Strict
from forge.recipe.judge import LlmJudge, is_file_source
from forge.recipe.registry import BLOCKS, EvaluatorSettings
from forge.recipe.rft_settings import RewardSource

SPLIT = r"^[A-Za-z0-9_-]+$"  # a split's name: it becomes a metric's middle part, fact_recall.<split>.exact


class FactRecall(EvaluatorSettings):
    """Greedy generation from each question, scored against its reference answer."""

    block: ClassVar[str] = "fact_recall"

    source: str = Field(pattern=NAME, description="a data source of JSON records holding question and answer")
    question_field: str = "question"
    answer_field: str = "answer"
    prompt: str = Field("{question}\n", description="the prompt; {question} is replaced by the question "
                        "(with chat: the user turn's text)")
    match: Literal["exact", "contains"] = Field("contains", description="which score fact_recall_min gates")
    max_new_tokens: int = Field(32, gt=0, le=4096)
    limit: int = Field(50, gt=0, description="at most this many questions (the first ones; with split_field, per split)")
    split: Literal["all", "train", "heldout"] = Field(
        "all", description="all records (did it learn the facts?), or only the held-out / training ones")
    split_field: str | None = Field(
        None, description="a record field naming each question's split (e.g. train / heldout phrasings): figures "
                          "per value, fact_recall.<value>.exact / .contains; default: the source's hashed holdout")
    chat: bool = Field(False, description="ask through the model's chat template (its tokenizer's, else forge's "
                                          "default, the one SFT trains with) as a user turn")
    complete_splits: list[Annotated[str, Field(pattern=SPLIT)]] = Field(
        default_factory=list, description="splits whose questions are the start of a document's sentence: asked as "
        "plain text after the document separator, not through chat, and scored on whether the completion begins "
        "with the answer (exact) or holds it (contains)")

    @model_validator(mode="after")
    def _complete_needs_splits(self) -> FactRecall:
        if self.complete_splits and self.split_field is None:
            raise ValueError("complete_splits names values of split_field: set split_field (e.g. split)")
        return self


class Instruct(EvaluatorSettings):
    """Instruction following: greedy replies to prompts (a chat source's conversations without their
    last reply, or prompt_field), exact match with the reference reply: `instruct.accuracy`
    (the reply's first line) and `instruct.contains`."""

    block: ClassVar[str] = "instruct"

    source: str = Field(pattern=NAME, description="chat records (the data source's chat:), or rows with prompt_field")
    prompt_field: str = Field("prompt", description="without a chat: mapping on the source: the prompt text field")
    answer_field: str = Field("response", description="without a chat: mapping on the source: the reference reply")
    split: Literal["all", "train", "heldout"] = Field("heldout", description="which records (held-out: never trained on)")
    split_field: str | None = Field(None, description="a record field naming its split; default: the hashed holdout")
    chat: bool = Field(True, description="prompts through the model's chat template (else plain text)")
    limit: int = Field(50, gt=0, description="at most this many prompts (the first ones)")
    max_new_tokens: int = Field(48, gt=0, le=4096)


class Preference(EvaluatorSettings):
    """Preference accuracy: the model gives `chosen` a higher log-likelihood than `rejected`."""

    block: ClassVar[str] = "preference"

    source: str = Field(pattern=NAME)
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    prompt_field: str | None = Field(None, description="None: the pair's shared prefix is the prompt")
    limit: int = Field(200, gt=0)
    split: Literal["all", "train", "heldout"] = "all"


class MeanReward(EvaluatorSettings):
    """Mean reward of completions the model generates for held-out prompts, under reward functions
    (forge.lm.rewards): per source and the weighted total. Defaults come from the recipe's rft
    stage(s): their prompt data, prompt_field, rewards and max_new_tokens."""

    block: ClassVar[str] = "reward"

    source: str | None = Field(None, pattern=NAME, description="data source of prompt rows; default: the rft stage's first")
    prompt_field: str | None = Field(None, description="the rows' prompt text field; default: the rft stage's, else 'prompt'")
    rewards: list[RewardSource] | None = Field(None, description="default: the rewards of the recipe's rft stage(s)")
    split: Literal["all", "train", "heldout"] = Field("heldout", description="which prompt rows (the stage's split)")
    limit: int = Field(32, gt=0, description="at most this many prompts (the first ones)")
    max_new_tokens: int | None = Field(None, gt=0, le=32_768, description="default: the rft stage's, else 32")
    temperature: float | None = Field(None, gt=0, le=10, description="None: greedy completions; else sampled")
    samples: int = Field(1, ge=1, le=64, description="completions per prompt (more than 1 needs a temperature)")
    seed: int = Field(0, description="the sampling seed (the same prompts and draws for every model)")

    @model_validator(mode="after")
    def _sampled(self) -> MeanReward:
        if self.samples > 1 and self.temperature is None:
            raise ValueError("samples > 1 needs a temperature (greedy completions of one prompt are all the same)")
        return self


class GenQa(EvaluatorSettings):
    """Generative QA on your own question/reference file (or a data source): greedy answers scored
    by SQuAD exact match and token F1, and ROUGE-L (LCS F-measure), each the best over a question's
    references (`answer_field` may hold one string or a list)."""

    block: ClassVar[str] = "gen_qa"

    source: str = Field(description="a JSONL file of question/answer rows, or a data source name")
    question_field: str = "question"
    answer_field: str = "answer"
    split: Literal["all", "train", "heldout"] = Field("all", description="a data source's records to use")
    chat: bool = Field(True, description="ask through the model's chat template as a user turn (else plain text)")
    limit: int = Field(100, gt=0, description="at most this many questions (the first ones)")
    max_new_tokens: int = Field(32, gt=0, le=4096)

    def sources(self) -> list[str]:
        return [] if is_file_source(self.source) else [self.source]


class LmEval(EvaluatorSettings):
    """Benchmarks through lm-eval (`pip install 'forge[eval]'`), run on the in-memory model."""

    block: ClassVar[str] = "lm_eval"

    tasks: list[str] = Field(min_length=1, description="task names, or paths to task YAML files")
    limit: int | None = Field(None, gt=0)
    num_fewshot: int | None = Field(None, ge=0)


class Gates(Strict):
    """Thresholds the Novella must meet to receive the deployment alias (fractions, 0.1 = 10%)."""

    retention_ppl_increase_max: float | None = Field(
        None, ge=0, description="largest allowed rise of a general source's perplexity over the start")
    domain_ppl_decrease_min: float | None = Field(
        None, le=1, description="smallest required fall of each domain source's perplexity")
    fact_recall_min: float | None = Field(None, ge=0, le=1, description="fact recall (eval.fact_recall.match); "
                                          "with a split_field, on every split")
    preference_accuracy_min: float | None = Field(None, ge=0, le=1)
    reward_mean_min: float | None = Field(None, description="smallest allowed mean reward (eval.reward's weighted total)")
    min: dict[str, float] = Field(default_factory=dict, description="any metric: at least this value")
    max: dict[str, float] = Field(default_factory=dict, description="any metric: at most this value")


class EvalBlock(Strict):
    # the blocks registered in BLOCKS that are not fields here are kept as extras; any other key is refused
    model_config = ConfigDict(extra="allow", validate_default=True)

    domain: list[str] | None = Field(
        None, description="sources whose held-out perplexity should fall; default: the proprietary ones stages train on")
    general: list[str] | None = Field(
        None, description="sources whose perplexity must hold (retention); default: the other sources stages train on")
    perplexity: list[str] = Field(default_factory=list, description="further sources to report perplexity on")
    fact_recall: FactRecall | None = None
    instruct: Instruct | None = None
    preference: Preference | None = None
    reward: MeanReward | None = None
    custom: list[str] = Field(default_factory=list, description="evaluators as 'file.py:function'")
    lm_eval: LmEval | None = None
    llm_judge: LlmJudge | None = None
    gen_qa: GenQa | None = None
    seq_len: int | None = Field(None, ge=8, description="default: the last training stage's seq_len")
    max_blocks: int = Field(16, gt=0, description="held-out blocks per source")
    batch_size: int = Field(8, gt=0)
    separator: Literal["eos", "bos"] | None = Field(None, description="default: the last training stage's")
    time_budget_s: float | None = Field(None, gt=0, description="evaluators past this are skipped (and listed)")
    after_each_stage: bool = Field(
        False, description="also evaluate each stage's output as soon as that stage ends (into its MLflow run)")
    primary: str | None = Field(
        None, description="the metric that decides the champion; default: ppl of the first domain source, else reward.mean")
    gates: Gates = Gates()
    intended_use: str | None = Field(None, description="the model card's intended-use paragraph")
    limitations: list[str] = Field(default_factory=list, description="model card: limitations besides forge's own")

    @model_validator(mode="wrap")
    @classmethod
    def _registered_blocks(cls, value: Any, handler: Any) -> EvalBlock:
        """Validate a registered block that is not a field with its class (errors at `eval.<block>...`)."""
        if not isinstance(value, dict):
            same: EvalBlock = handler(value)
            return same
        extra, errors = {}, []
        for key, item in value.items():
            if key in cls.model_fields:
                continue
            if not isinstance(key, str) or key not in BLOCKS:
                errors.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=item))
                continue
            try:
                extra[key] = BLOCKS[key].model_validate(item)
            except ValidationError as e:
                errors += _moved(e, (key,))
        try:
            block: EvalBlock = handler({k: v for k, v in value.items() if k in cls.model_fields})
        except ValidationError as e:
            if not errors:
                raise
            errors = _moved(e, ()) + errors
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        block.__pydantic_extra__ = extra
        return block

    @classmethod
    def registered_fields(cls) -> dict[str, FieldInfo]:
        """The registered blocks that are not fields, described as fields (forge.recipe.errors lists them)."""
        return {k: FieldInfo(annotation=v, default=None) for k, v in BLOCKS.items() if k not in cls.model_fields}

    def block(self, name: str) -> Any:
        """The settings under `eval.<name>` (a field, or a registered block), None where not given."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return (self.__pydantic_extra__ or {}).get(name)

    def blocks(self) -> dict[str, EvaluatorSettings]:
        """Every evaluator settings block the suite holds, by its key under eval:."""
        held = {k: getattr(self, k) for k in type(self).model_fields} | (self.__pydantic_extra__ or {})
        return {k: v for k, v in held.items() if isinstance(v, EvaluatorSettings)}

    def sources(self) -> list[str]:
        """Every data source the suite reads."""
        names = [*(self.domain or []), *(self.general or []), *self.perplexity]
        names += [n for b in self.blocks().values() for n in b.sources()]
        return list(dict.fromkeys(names))


def _moved(error: ValidationError, prefix: tuple[Any, ...]) -> list[InitErrorDetails]:
    """`error`'s problems, each at `prefix` + its own place and with its own message."""
    return [InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]), loc=(*prefix, *e["loc"]), input=e["input"])
            for e in error.errors()]


def higher_is_better(metric: str) -> bool:
    """ppl, loss and retention fall when a model gets better; every other metric rises."""
    head = metric.split(".")[0]
    return head not in ("ppl", "loss", "retention", "eval_loss", "eval_ppl")
