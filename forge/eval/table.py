"""Evaluators: the ONE table of what the evaluation suite (a recipe's `eval:` block) measures. A row
is an `Evaluator`: the key of its settings block under `eval:`, one line of summary (`forge eval
--help` lists the rows), the function that measures one model, and optionally one that runs once
before any model loads (reading and checking its data, opening clients: a bad file fails before
minutes of model loading). forge.eval.suite runs the rows, in order, on every model it compares;
the metric names are the measure functions' own.

Adding an evaluator is one settings class (a forge.recipe.registry.EvaluatorSettings with
`block: ClassVar[str] = "NAME"`, which `eval:` then accepts as `eval.NAME`), one measure function
and one row below (tests/eval/test_toy_evaluator.py does both from inside a test). Functions are
dotted names, imported on demand: the built-in ones pull in torch and the generation code.
"""
from __future__ import annotations

import importlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Model:
    """One model the suite measures: its label in the comparison, its folder, and the loaded
    transformers model and tokenizer (on the context's device)."""

    label: str
    path: Path
    model: Any
    tokenizer: Any


@dataclass(frozen=True)
class Context:
    """What an evaluator reads besides its own settings."""

    suite: Any                  # the resolved EvalBlock: seq_len, separator, batch_size, domain, general
    sources: dict[str, Any]     # data source name -> forge.data.sources.Source
    root: Path | None           # the folder user code (file.py:function) is relative to
    device: str
    cache_dir: Path | None      # where an evaluator may keep caches across runs (None: keep none)
    closing: ExitStack          # what `prepare` opens, registered here, is closed when the suite ends
    prepared: Any = None        # what the row's `prepare` returned


class Measure(Protocol):
    def __call__(self, model: Model, settings: Any, ctx: Context) -> dict[str, float]: ...


class Prepare(Protocol):
    def __call__(self, settings: Any, ctx: Context) -> Any: ...


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Evaluator:
    block: str                  # its key under eval:
    summary: str                # one line for `forge eval --help` and the docs
    measure: str                # "module:function", a Measure: one model's figures {metric: value}
    prepare: str | None = None  # "module:function", a Prepare: once, before any model loads -> ctx.prepared
    each: bool = False          # the block is a list, each item measured (and time-budgeted) on its own
    picks: Callable[[Any], Any] | None = None  # its settings from the whole suite, where they are not one block

    def settings(self, suite: Any) -> Any:
        """Its settings in `suite`; None (or an empty list) where the suite does not ask for it."""
        return self.picks(suite) if self.picks is not None else suite.block(self.block)

    def parts(self, settings: Any) -> list[tuple[str, Any]]:
        """(what the time budget names when it skips it, settings) for each separate measurement."""
        return [(str(item), item) for item in settings] if self.each else [(self.block, settings)]

    def measurer(self) -> Measure:
        fn: Measure = _resolve(self.measure)
        return fn

    def preparer(self) -> Prepare | None:
        return _resolve(self.prepare) if self.prepare else None


def _perplexity_sources(suite: Any) -> list[str]:
    return list(dict.fromkeys([*(suite.domain or []), *(suite.general or []), *suite.perplexity]))


_B = "forge.eval.builtin"
EVALUATORS: dict[str, Evaluator] = {e.block: e for e in (
    Evaluator("perplexity", "held-out perplexity and loss per source (eval.domain, eval.general, eval.perplexity)",
              f"{_B}:perplexity", f"{_B}:prepare_perplexity", picks=_perplexity_sources),
    Evaluator("fact_recall", "greedy answers to questions scored against reference answers",
              f"{_B}:fact_recall", f"{_B}:prepare_fact_recall"),
    Evaluator("instruct", "instruction following: greedy replies matched with reference replies",
              f"{_B}:instruct", f"{_B}:prepare_instruct"),
    Evaluator("preference", "preference accuracy: chosen more likely than rejected",
              f"{_B}:preference", f"{_B}:prepare_preference"),
    Evaluator("reward", "mean reward of generated completions under reward functions",
              f"{_B}:reward", f"{_B}:prepare_reward"),
    Evaluator("gen_qa", "generative QA: exact match, token F1 and ROUGE-L against references",
              f"{_B}:gen_qa", f"{_B}:prepare_gen_qa"),
    Evaluator("llm_judge", "an LLM judge grades the model's answers on a rubric",
              f"{_B}:llm_judge", f"{_B}:prepare_llm_judge"),
    Evaluator("custom", "your own functions, file.py:function", f"{_B}:custom", f"{_B}:prepare_custom", each=True),
    Evaluator("lm_eval", "lm-eval benchmark tasks on the in-memory model", f"{_B}:lm_eval"),
)}


def asked(settings: Any) -> bool:
    """Whether a row's settings ask for it (a block given, a list not empty)."""
    return settings is not None and settings != []
