"""Run a recipe's evaluation suite (its `eval:` block) on several models: the starting checkpoint
first, then each stage's output and the Novella. Returns a Comparison (forge.eval.report prints,
charts and saves it); figures relative to the start (retention, domain gain) come from the first
model's numbers. A time budget skips what does not fit and lists what was skipped.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from forge.data.formats import to_messages
from forge.data.mixing import in_holdout
from forge.errors import ForgeError, not_safetensors
from forge.eval import evaluators as E, recall
from forge.eval.gen_qa import gen_qa, qa_rows, read_jsonl
from forge.eval.judge_eval import llm_judge, open_judge, prompt_rows as judge_rows
from forge.eval.reward import RewardRun, load_rewards, mean_reward
from forge.kinds import row
from forge.lm.generation import Sampling
from forge.lm.perplexity import source_blocks
from forge.recipe.eval import EvalBlock
from forge.recipe.judge import is_file_source

SCHEMA = "forge.eval/1"
START, NOVELLA = "start", "novella"  # the labels of the starting checkpoint and the Novella in a run's comparison


@dataclass
class Comparison:
    """label -> metric -> value for each model, in order; the first is the baseline for deltas."""

    models: list[str]
    paths: dict[str, str]
    metrics: dict[str, dict[str, float]]
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def names(self) -> list[str]:
        return list(dict.fromkeys(k for label in self.models for k in self.metrics[label]))

    def deltas(self) -> dict[str, dict[str, float]]:
        base = self.metrics[self.models[0]]
        return {label: {k: v - base[k] for k, v in self.metrics[label].items() if k in base}
                for label in self.models[1:]}

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "baseline": self.models[0],
                "models": [{"label": m, "path": self.paths[m], "metrics": self.metrics[m]} for m in self.models],
                "deltas": self.deltas(), "skipped": self.skipped, "seconds": self.seconds}


def resolve_suite(block: EvalBlock | None, stages: list, data: dict) -> EvalBlock:
    """The suite with its defaults filled from the recipe: domain = the proprietary sources the
    stages train on, general = the others; seq_len and separator from the last training stage."""
    block = block or EvalBlock()
    # only kinds the suite measures perplexity for count (an rft stage's prompt rows are eval.reward's)
    trained = list(dict.fromkeys(n for s in stages if "perplexity" in row(s).evaluates for n in s.sources))
    if not stages:  # a suite file: every source it names is the suite's
        trained = list(data)
    trained = [n for n in trained if data[n].chat is None]  # perplexity reads plain text, not chat records
    train_stages = [s for s in stages if hasattr(s, "seq_len")]
    last = train_stages[-1] if train_stages else None
    return block.model_copy(update={
        "reward": _reward_defaults(block.reward, stages),
        "domain": block.domain if block.domain is not None else [n for n in trained if data[n].proprietary],
        "general": block.general if block.general is not None else [n for n in trained if not data[n].proprietary],
        "seq_len": block.seq_len or (last.seq_len if last else 256),
        "separator": block.separator or getattr(last, "separator", "eos"),
    })


def _reward_defaults(reward, stages: list):
    """eval.reward with what it leaves out taken from the recipe's rewarded stage(s) (those whose
    kind evaluates "reward", e.g. rft): the first one's prompt data, prompt_field and max_new_tokens,
    and every such stage's reward sources."""
    if reward is None:
        return None
    rft = [s for s in stages if "reward" in row(s).evaluates]
    first = rft[0] if rft else None
    rewards = reward.rewards if reward.rewards is not None else list({r.source: r for s in rft for r in s.rewards}.values())
    if (reward.source is None and first is None) or not rewards:
        missing = "source" if reward.source is None and first is None else "rewards"
        raise ForgeError(f"eval.reward.{missing}: not given and no rft stage to take it from")
    return reward.model_copy(update={
        "source": reward.source or first.data[0], "rewards": rewards,
        "prompt_field": reward.prompt_field or (first.prompt_field if first else "prompt"),
        "max_new_tokens": reward.max_new_tokens or (first.max_new_tokens if first else 32)})


def primary_metric(suite: EvalBlock) -> str:
    """The metric that decides the champion: the recipe's, else the first domain (then general)
    source's held-out perplexity, else the mean reward."""
    if suite.primary:
        return suite.primary
    names = [*(suite.domain or []), *(suite.general or []), *suite.perplexity]
    if names:
        return f"ppl.{names[0]}"
    return "reward.mean" if suite.reward is not None else "eval_loss"


def _records(source, split: str, split_field: str | None = None) -> list[tuple[str, dict]]:
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


def qa_pairs(suite: EvalBlock, sources: dict) -> dict[str, list[tuple[str, str]]]:
    """Metric prefix -> (question, answer) pairs: `fact_recall`, or with a split_field
    `fact_recall.<value>` for each value of that field (in order of appearance), each up to limit."""
    fr = suite.fact_recall
    groups: dict[str, list[tuple[str, str]]] = {}
    for w, r in _records(sources[fr.source], fr.split, fr.split_field):
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


def instruct_pairs(suite: EvalBlock, sources: dict) -> list[tuple[list[dict], str]]:
    """(prompt messages, reference reply) per record: a chat source's conversation up to its last
    reply, or the rows' prompt_field and answer_field."""
    ins, source = suite.instruct, sources[suite.instruct.source]
    out = []
    for w, r in _records(source, ins.split, ins.split_field)[: ins.limit]:
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


def preference_pairs(suite: EvalBlock, sources: dict) -> list[tuple[str, str, str]]:
    pf = suite.preference
    rows = _records(sources[pf.source], pf.split)[: pf.limit]
    return [(_field(r, pf.prompt_field, w, "eval.preference.prompt_field") if pf.prompt_field else "",
             _field(r, pf.chosen_field, w, "eval.preference.chosen_field"),
             _field(r, pf.rejected_field, w, "eval.preference.rejected_field")) for w, r in rows]


def prompt_rows(suite: EvalBlock, sources: dict) -> list[dict]:
    rw = suite.reward
    rows = _records(sources[rw.source], rw.split)[: rw.limit]
    if not rows:
        raise ForgeError(f"eval.reward: data.{rw.source} has no {rw.split} prompt rows "
                         f"(holdout {sources[rw.source].holdout}); set eval.reward.split or the source's holdout")
    return [r for w, r in rows if _field(r, rw.prompt_field, w, "eval.reward.prompt_field") is not None]


def _rows_of(block, sources: dict) -> list[tuple[str, dict]]:
    """eval.gen_qa's / eval.llm_judge's rows: its JSONL file, or its data source's `split` records."""
    return read_jsonl(block.source) if is_file_source(block.source) else _records(sources[block.source], block.split)


def _tokenizer_key(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


def load(path: str | Path, device):
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ForgeError(f"{path}: not a model folder (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
    except SafetensorError as e:  # often a pickle or torch.save archive given the .safetensors name
        bad = next((f for f in sorted(path.glob("*.safetensors")) if not _parses(f)), path)
        raise not_safetensors(bad, e) from None
    return model.to(device), AutoTokenizer.from_pretrained(path)


def _parses(file: Path) -> bool:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt"):
            return True
    except SafetensorError:
        return False


def run_suite(models: dict[str, Path], suite: EvalBlock, sources: dict, root: Path | None = None,
              log=print, cache=None) -> Comparison:
    """Every evaluator of `suite` on every model (in order; the first is the starting point).
    `cache` (forge.eval.cache.EvalCache): figures of a model measured before are reused."""
    import torch

    missing = [n for n in suite.sources() if n not in sources]
    if missing:
        raise ForgeError(f"eval: unknown data source(s) {missing}; known: {sorted(sources)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    customs = [(spec, E.load_custom(spec, root)) for spec in suite.custom]
    qa = qa_pairs(suite, sources) if suite.fact_recall else None
    instruct = instruct_pairs(suite, sources) if suite.instruct else None
    prefs = preference_pairs(suite, sources) if suite.preference else None
    prompts = prompt_rows(suite, sources) if suite.reward else None
    gq, lj = suite.gen_qa, suite.llm_judge
    qa_gen = qa_rows(_rows_of(gq, sources), gq.question_field, gq.answer_field, gq.limit) if gq else None
    judged = judge_rows(_rows_of(lj, sources), lj.prompt_field, lj.limit) if lj else None
    judge = open_judge(lj, cache.path.parent / "judge" if cache is not None else None) if lj else None
    rewards = load_rewards(suite.reward.rewards, root) if suite.reward else None  # bad sources fail before any model loads
    ppl_sources = list(dict.fromkeys([*suite.domain, *suite.general, *suite.perplexity]))
    blocks_cache: dict[str, dict] = {}
    started, skipped = time.perf_counter(), []
    out: dict[str, dict[str, float]] = {}

    def fits(label: str, what: str) -> bool:
        if suite.time_budget_s is None or time.perf_counter() - started < suite.time_budget_s:
            return True
        skipped.append(f"{label}: {what}")
        return False

    try:  # Python rewards run in worker processes: they end with the evaluation
        for label, path in models.items():
            known = cache.get(path) if cache is not None else None
            if known is not None:
                log(f"  eval {label}: {path} (measured before: reused)")
                out[label] = known
                continue
            log(f"  eval {label}: {path}")
            before = len(skipped)
            model, tok = load(path, device)
            m: dict[str, float] = {}
            if ppl_sources and fits(label, "perplexity"):
                key = _tokenizer_key(tok)
                if key not in blocks_cache:
                    blocks_cache[key] = source_blocks(sources, ppl_sources, tok, suite.seq_len, suite.separator,
                                                      suite.max_blocks)
                m.update(E.perplexity(model, blocks_cache[key], suite.batch_size, device))
            if qa is not None and fits(label, "fact_recall"):
                fr = suite.fact_recall
                for name, pairs in qa.items():
                    m.update(recall.fact_recall(model, tok, pairs, fr.max_new_tokens, device,
                                                recall.Asking(fr.prompt, suite.separator, fr.chat, name)))
            if instruct is not None and fits(label, "instruct"):
                ins = suite.instruct
                m.update(recall.instruction_following(model, tok, instruct, ins.max_new_tokens, device, ins.chat,
                                                      suite.separator))
            if prefs is not None and fits(label, "preference"):
                m.update(E.preference_accuracy(model, tok, prefs, device, suite.seq_len, suite.separator))
            if prompts is not None and fits(label, "reward"):
                rw = suite.reward
                run = RewardRun(rw.prompt_field, Sampling(rw.max_new_tokens, rw.temperature, rw.samples), device,
                                suite.batch_size, rw.seed)
                m.update(mean_reward(model, tok, prompts, rewards, run, f"eval.reward on {label}"))
            if qa_gen is not None and fits(label, "gen_qa"):
                m.update(gen_qa(model, tok, qa_gen, gq, device, suite.separator))
            if judge is not None and fits(label, "llm_judge"):
                m.update(llm_judge(model, tok, judged, judge, lj, device))
            for spec, fn in customs:
                if fits(label, spec):
                    m.update(E.run_custom(spec, fn, model, tok, sources, device))
            if suite.lm_eval is not None and fits(label, "lm_eval"):
                from forge.eval.lm_eval_task import run_lm_eval

                m.update(run_lm_eval(model, tok, suite.lm_eval, root, device))
            out[label] = m
            del model
            if cache is not None and len(skipped) == before:  # a partial evaluation is not kept
                cache.put(path, label, m)
    finally:
        for reward in rewards or []:
            reward.close()
        if judge is not None:
            judge.close()
    first = out[next(iter(models))]
    for label in models:
        out[label].update(E.relative_change(out[label], first, suite.general, suite.domain))
    return Comparison(list(models), {k: str(v) for k, v in models.items()}, out, skipped,
                      time.perf_counter() - started)
