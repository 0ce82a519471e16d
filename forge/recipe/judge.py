"""Recipe schema of LLM judges (forge.lm.judges): how a `judge:` reward source or an
`eval.llm_judge` block grades completions (rubric, pointwise or group scoring, score scale); the
judge's address (a local folder, `catalog://FAMILY@PHASE`, an OpenAI-compatible `http(s)://`
endpoint or `bedrock:MODEL_ID`) is checked by forge.recipe.address."""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from forge.recipe.address import check_address
from forge.recipe.data import NAME, Strict
from forge.recipe.registry import EvaluatorSettings

JUDGE_PREFIX = "judge:"  # a reward source `judge:<address>`


class JudgeOptions(Strict):
    """How a judge grades: a rubric (a built-in name or a YAML file of one's own), each completion
    alone (pointwise) or all completions of a prompt in one judge call (group), on integer scores
    low..high. A local judge's score is its expected score over those score tokens; an endpoint's is
    parsed from its text."""

    rubric: str = Field("instruction_following", min_length=1, description="instruction_following, "
                        "summarization_faithfulness, reasoning_correctness, rag_faithfulness, or a rubric YAML file")
    scoring: Literal["pointwise", "group"] = Field("pointwise", description="group: every completion of one prompt "
                                                   "in one judge call, scored against each other")
    low: int = Field(1, ge=0, le=100)
    high: int = Field(5, ge=1, le=100)
    model: str | None = Field(None, description="endpoint: the `model` field of the chat request (default: the "
                              "endpoint's first listed model)")
    api_key_env: str | None = Field(None, description="endpoint: the environment variable holding its API key")
    max_tokens: int = Field(64, gt=0, le=4096, description="endpoint / bedrock: the judge's answer length")
    cache: bool = Field(True, description="keep each verdict in the run folder, keyed by judge, rubric and text")

    @model_validator(mode="after")
    def _scale(self) -> JudgeOptions:
        if self.high <= self.low:
            raise ValueError(f"high ({self.high}) must be above low ({self.low})")
        return self


class LlmJudge(JudgeOptions, EvaluatorSettings):
    """`eval.llm_judge`: the model answers prompts (greedy, in its chat template) and the judge grades
    each answer; reports `llm_judge.<rubric>.mean` (on the low..high scale) and `.std`."""

    block: ClassVar[str] = "llm_judge"

    judge: str = Field(min_length=3, description="a model folder, catalog://FAMILY@PHASE, http(s)://... or bedrock:ID")
    source: str = Field(description="a data source name, or a JSONL file of prompt rows")
    prompt_field: str = "prompt"
    split: Literal["all", "train", "heldout"] = Field("heldout", description="a data source's records to use")
    limit: int = Field(32, gt=0, description="at most this many prompts (the first ones)")
    max_new_tokens: int = Field(48, gt=0, le=4096)
    timeout_s: float = Field(60.0, gt=0, le=3600, description="endpoint / bedrock: one request")
    region: str | None = Field(None, description="bedrock: AWS region (default: boto3's)")

    @field_validator("judge")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_address(value.removeprefix(JUDGE_PREFIX))

    def sources(self) -> list[str]:
        return [] if is_file_source(self.source) else [self.source]


def is_file_source(source: str) -> bool:
    """A source given as a file path rather than a data source name."""
    import re

    return "/" in source or source.endswith((".jsonl", ".json")) or not re.match(NAME, source)


def resolve_judge_paths(ev: dict[str, Any], stages: list[Any], fix: Callable[[str], str]) -> None:
    """Relative paths of judge folders, rubric files and eval files made relative to the recipe
    (what forge.recipe.schema.resolve_paths does for the other paths)."""
    def local(p: Any) -> bool:
        return isinstance(p, str) and not p.startswith(("http://", "https://", "bedrock:", "catalog://"))

    blocks = [rw for s in stages if isinstance(s, dict) and isinstance(s.get("rewards"), list) for rw in s["rewards"]]
    reward = ev.get("reward") if isinstance(ev.get("reward"), dict) else {}
    blocks += reward.get("rewards") if isinstance(reward.get("rewards"), list) else []
    for rw in blocks:
        if isinstance(rw, dict) and isinstance(rw.get("source"), str) and rw["source"].startswith(JUDGE_PREFIX):
            target = rw["source"].removeprefix(JUDGE_PREFIX)
            rw["source"] = JUDGE_PREFIX + (fix(target) if local(target) else target)
            options = rw.get("judge")
            if isinstance(options, dict) and isinstance(options.get("rubric"), str) and "." in options["rubric"]:
                options["rubric"] = fix(options["rubric"])
    for key in ("llm_judge", "gen_qa"):
        block = ev.get(key)
        if not isinstance(block, dict):
            continue
        judge = block.get("judge")
        if isinstance(judge, str) and local(judge.removeprefix(JUDGE_PREFIX)):
            block["judge"] = fix(judge.removeprefix(JUDGE_PREFIX))
        if isinstance(block.get("rubric"), str) and "." in block["rubric"]:
            block["rubric"] = fix(block["rubric"])
        if isinstance(block.get("source"), str) and is_file_source(block["source"]):
            block["source"] = fix(block["source"])
