"""Run a recipe's evaluation suite (its `eval:` block) on several models: the starting checkpoint
first, then each stage's output and the Novella. Returns a Comparison (forge.eval.report prints,
charts and saves it); figures relative to the start (retention, domain gain) come from the first
model's numbers. A time budget skips what does not fit and lists what was skipped.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forge.errors import ForgeError, not_safetensors
from forge.eval import evaluators as E
from forge.eval.table import EVALUATORS, Context, Evaluator, Model, asked
from forge.kinds import row
from forge.recipe.eval import EvalBlock

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


def load(path: str | Path, device):
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    # a LoRA adapter folder (lora.merge: false, forge serve's checkpoints) loads as its base with the adapter
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise ForgeError(f"{path}: not a model folder (no config.json, nor a LoRA adapter's adapter_config.json)")
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
    """Every evaluator of `suite` (forge.eval.table) on every model (in order; the first is the
    starting point). `cache` (forge.eval.cache.EvalCache): figures of a model measured before are reused."""
    import torch

    missing = [n for n in suite.sources() if n not in sources]
    if missing:
        raise ForgeError(f"eval: unknown data source(s) {missing}; known: {sorted(sources)}")
    started, skipped, out = time.perf_counter(), [], {}

    def fits(label: str, what: str) -> bool:
        if suite.time_budget_s is None or time.perf_counter() - started < suite.time_budget_s:
            return True
        skipped.append(f"{label}: {what}")
        return False

    with ExitStack() as closing:  # what the evaluators opened (reward workers, judges) ends with the evaluation
        ctx = Context(suite, sources, root, "cuda" if torch.cuda.is_available() else "cpu",
                      cache.path.parent if cache is not None else None, closing)
        rows = _prepared(suite, ctx)  # every evaluator's data read and checked before any model loads
        for label, path in models.items():
            known = cache.get(path) if cache is not None else None
            log(f"  eval {label}: {path}{' (measured before: reused)' if known is not None else ''}")
            if known is None:
                before = len(skipped)
                model = Model(label, Path(path), *load(path, ctx.device))
                known = {}
                for ev, settings, c in rows:
                    for what, part in ev.parts(settings):
                        if fits(label, what):
                            known.update(ev.measurer()(model, part, c))
                del model
                if cache is not None and len(skipped) == before:  # a partial evaluation is not kept
                    cache.put(path, label, known)
            out[label] = known
    first = out[next(iter(models))]
    for label in models:
        out[label].update(E.relative_change(out[label], first, suite.general, suite.domain))
    return Comparison(list(models), {k: str(v) for k, v in models.items()}, out, skipped,
                      time.perf_counter() - started)


def _prepared(suite: EvalBlock, ctx: Context) -> list[tuple[Evaluator, Any, Context]]:
    """(row, its settings, its context) of each evaluator the suite asks for, in the table's order."""
    rows = []
    for ev in EVALUATORS.values():
        settings = ev.settings(suite)
        if asked(settings):
            prepare = ev.preparer()
            rows.append((ev, settings, replace(ctx, prepared=prepare(settings, ctx) if prepare else None)))
    return rows
