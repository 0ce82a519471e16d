"""The built-in evaluators of forge.eval.table: for each, what it reads once before any model
loads (its records, taken from a data source's split or a JSONL file, its reward functions or
judge) and what it measures on each model, as `prepare(settings, ctx)` and
`measure(model, settings, ctx)`. The scoring itself lives in evaluators.py, recall.py, reward.py,
gen_qa.py, judge_eval.py and lm_eval_task.py.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable

from forge.data.formats import to_messages
from forge.data.mixing import in_holdout
from forge.errors import ForgeError
from forge.eval import evaluators as E, recall
from forge.eval.gen_qa import gen_qa as score_gen_qa, qa_rows, read_jsonl
from forge.eval.judge_eval import llm_judge as judge_answers, open_judge, prompt_rows as judged_prompt_rows
from forge.eval.reward import RewardRun, load_rewards, mean_reward
from forge.eval.table import Context, Model
from forge.lm.generation import Sampling
from forge.lm.perplexity import source_blocks
from forge.recipe.eval import FactRecall, GenQa, Instruct, LmEval, MeanReward, Preference
from forge.recipe.judge import LlmJudge, is_file_source

Metrics = dict[str, float]


# ------------------------------------------------------------------------------ the records
def records(source: Any, split: str, split_field: str | None = None) -> list[tuple[str, dict]]:
    """(where, row) of the records in `split`: by the record's `split_field` when given, else by
    the source's hashed holdout (the records no stage trains on)."""
    rows = []
    for record, where, item in source.rows():
        if isinstance(item, ForgeError):
            raise item
        if not isinstance(item, dict):
            raise ForgeError(f"{where}: data.{source.name}: expected a JSON record (question/answer or chosen/rejected)")
        if split_field is not None:
            keep = split == "all" or item.get(split_field) == split
        else:
            keep = split == "all" or (split == "heldout") == in_holdout(source.holdout_key, record, source.holdout)
        if keep:
            rows.append((where, item))
    return rows


def _field(row: dict, key: str, where: str, what: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise ForgeError(f"{where}: record has no text field {key!r} ({what}); fields present: {sorted(row)[:12]}")
    return value


def qa_pairs(fr: FactRecall, sources: dict) -> dict[str, list[tuple[str, str]]]:
    """Metric prefix -> (question, answer) pairs: `fact_recall`, or with a split_field
    `fact_recall.<value>` for each value of that field (in order of appearance), each up to limit."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for w, r in records(sources[fr.source], fr.split, fr.split_field):
        if fr.split_field is None:
            name = "fact_recall"
        else:
            value = r.get(fr.split_field)
            if not isinstance(value, str) or not value.replace("_", "").replace("-", "").isalnum():
                raise ForgeError(f"{w}: eval.fact_recall.split_field {fr.split_field!r}: expected a split name "
                                 f"(letters, digits, _ or -), got {value!r}")
            name = f"fact_recall.{value}"
        pairs = groups.setdefault(name, [])
        if len(pairs) < fr.limit:
            pairs.append((_field(r, fr.question_field, w, "eval.fact_recall.question_field"),
                          _field(r, fr.answer_field, w, "eval.fact_recall.answer_field")))
    if not groups:
        raise ForgeError(f"eval.fact_recall: data.{fr.source} has no {fr.split} records to ask")
    return groups


def instruct_pairs(ins: Instruct, sources: dict) -> list[tuple[list[dict], str]]:
    """(prompt messages, reference reply) per record: a chat source's conversation up to its last
    reply, or the rows' prompt_field and answer_field."""
    source = sources[ins.source]
    out = []
    for w, r in records(source, ins.split, ins.split_field)[: ins.limit]:
        if source.chat is None:
            out.append(([{"role": "user", "content": _field(r, ins.prompt_field, w, "eval.instruct.prompt_field")}],
                        _field(r, ins.answer_field, w, "eval.instruct.answer_field")))
            continue
        messages = to_messages(r, source.chat, w)
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise ForgeError(f"{w}: eval.instruct: the conversation does not end with an assistant reply to score")
        out.append((messages[:-1], messages[-1]["content"]))
    if not out:
        raise ForgeError(f"eval.instruct: data.{ins.source} has no {ins.split} records "
                         f"(holdout {source.holdout}); set eval.instruct.split or the source's holdout")
    return out


def preference_pairs(pf: Preference, sources: dict) -> list[tuple[str, str, str]]:
    rows = records(sources[pf.source], pf.split)[: pf.limit]
    return [(_field(r, pf.prompt_field, w, "eval.preference.prompt_field") if pf.prompt_field else "",
             _field(r, pf.chosen_field, w, "eval.preference.chosen_field"),
             _field(r, pf.rejected_field, w, "eval.preference.rejected_field")) for w, r in rows]


def prompt_rows(rw: MeanReward, sources: dict) -> list[dict]:
    rows = records(sources[rw.source], rw.split)[: rw.limit]
    if not rows:
        raise ForgeError(f"eval.reward: data.{rw.source} has no {rw.split} prompt rows "
                         f"(holdout {sources[rw.source].holdout}); set eval.reward.split or the source's holdout")
    return [r for w, r in rows if _field(r, rw.prompt_field, w, "eval.reward.prompt_field") is not None]


def rows_of(block: GenQa | LlmJudge, sources: dict) -> list[tuple[str, dict]]:
    """eval.gen_qa's / eval.llm_judge's rows: its JSONL file, or its data source's `split` records."""
    return read_jsonl(block.source) if is_file_source(block.source) else records(sources[block.source], block.split)


# ------------------------------------------------------------------------------ perplexity
def prepare_perplexity(names: list[str], ctx: Context) -> dict[str, dict]:
    """Tokenizer key -> the sources' held-out blocks, filled as models with new tokenizers come."""
    return {}


def _tokenizer_key(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


def perplexity(m: Model, names: list[str], ctx: Context) -> Metrics:
    suite, key = ctx.suite, _tokenizer_key(m.tokenizer)
    if key not in ctx.prepared:
        ctx.prepared[key] = source_blocks(ctx.sources, names, m.tokenizer, suite.seq_len, suite.separator,
                                          suite.max_blocks)
    return E.perplexity(m.model, ctx.prepared[key], suite.batch_size, ctx.device)


# ---------------------------------------------------------------------- generation and scoring
def prepare_fact_recall(fr: FactRecall, ctx: Context) -> dict[str, list[tuple[str, str]]]:
    groups = qa_pairs(fr, ctx.sources)
    missing = [s for s in fr.complete_splits if f"fact_recall.{s}" not in groups]
    if missing:  # a misspelt split would otherwise give no figure and no error
        found = [g.removeprefix("fact_recall.") for g in groups]
        raise ForgeError(f"eval.fact_recall.complete_splits: {missing} not among the {fr.split} records' "
                         f"{fr.split_field} values in data.{fr.source}: {found}")
    return groups


def fact_recall(m: Model, fr: FactRecall, ctx: Context) -> Metrics:
    """Each split's figures; a split of complete_splits is sentence starts, completed as plain text."""
    out: Metrics = {}
    complete = {f"fact_recall.{s}" for s in fr.complete_splits}
    for name, pairs in ctx.prepared.items():
        out.update(recall.fact_recall(m.model, m.tokenizer, pairs, fr.max_new_tokens, ctx.device,
                                      recall.Asking(fr.prompt, ctx.suite.separator, fr.chat, name, name in complete)))
    return out


def prepare_instruct(ins: Instruct, ctx: Context) -> list[tuple[list[dict], str]]:
    return instruct_pairs(ins, ctx.sources)


def instruct(m: Model, ins: Instruct, ctx: Context) -> Metrics:
    return recall.instruction_following(m.model, m.tokenizer, ctx.prepared, ins.max_new_tokens, ctx.device, ins.chat,
                                        ctx.suite.separator)


def prepare_preference(pf: Preference, ctx: Context) -> list[tuple[str, str, str]]:
    return preference_pairs(pf, ctx.sources)


def preference(m: Model, pf: Preference, ctx: Context) -> Metrics:
    return E.preference_accuracy(m.model, m.tokenizer, ctx.prepared, ctx.device, ctx.suite.seq_len,
                                 ctx.suite.separator)


def prepare_reward(rw: MeanReward, ctx: Context) -> tuple[list[dict], list]:
    """The prompt rows and the reward functions (bad sources fail before any model loads); Python
    rewards run in worker processes, which end with the evaluation."""
    prompts = prompt_rows(rw, ctx.sources)
    rewards = load_rewards(rw.rewards, ctx.root)
    for r in rewards:
        ctx.closing.callback(r.close)
    return prompts, rewards


def reward(m: Model, rw: MeanReward, ctx: Context) -> Metrics:
    prompts, rewards = ctx.prepared
    run = RewardRun(rw.prompt_field, Sampling(rw.max_new_tokens, rw.temperature, rw.samples), ctx.device,
                    ctx.suite.batch_size, rw.seed)
    return mean_reward(m.model, m.tokenizer, prompts, rewards, run, f"eval.reward on {m.label}")


def prepare_gen_qa(gq: GenQa, ctx: Context) -> list[tuple[str, list[str]]]:
    return qa_rows(rows_of(gq, ctx.sources), gq.question_field, gq.answer_field, gq.limit)


def gen_qa(m: Model, gq: GenQa, ctx: Context) -> Metrics:
    return score_gen_qa(m.model, m.tokenizer, ctx.prepared, gq, ctx.device, ctx.suite.separator)


def prepare_llm_judge(lj: LlmJudge, ctx: Context) -> tuple[list[dict], Any]:
    """The prompt rows and the judge, opened once for every model (its verdicts cached beside the suite's)."""
    rows = judged_prompt_rows(rows_of(lj, ctx.sources), lj.prompt_field, lj.limit)
    judge = open_judge(lj, ctx.cache_dir / "judge" if ctx.cache_dir is not None else None)
    ctx.closing.callback(judge.close)
    return rows, judge


def llm_judge(m: Model, lj: LlmJudge, ctx: Context) -> Metrics:
    rows, judge = ctx.prepared
    return judge_answers(m.model, m.tokenizer, rows, judge, lj, ctx.device)


# ------------------------------------------------------------------------- your own and lm-eval
def prepare_custom(specs: list[str], ctx: Context) -> dict[str, Callable]:
    return {spec: E.load_custom(spec, ctx.root) for spec in specs}


def custom(m: Model, spec: str, ctx: Context) -> Metrics:
    return E.run_custom(spec, ctx.prepared[spec], m.model, m.tokenizer, ctx.sources, ctx.device)


def lm_eval(m: Model, settings: LmEval, ctx: Context) -> Metrics:
    from forge.eval.lm_eval_task import run_lm_eval  # lm-eval is an optional extra

    return run_lm_eval(m.model, m.tokenizer, settings, ctx.root, ctx.device)
