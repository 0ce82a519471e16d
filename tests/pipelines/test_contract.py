"""Every pipeline module `forge run` can load takes the one context forge.pipeline defines:
`run(ctx: PipelineContext)`, and nothing else (forge/cli.py calls it so)."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pipelines
from forge.pipeline import PipelineContext

RUNNABLE = {"novella", "quickstart", "foundation"}


def _modules_with_run() -> dict[str, typing.Any]:
    found = {m.name: importlib.import_module(f"pipelines.{m.name}") for m in pkgutil.iter_modules(pipelines.__path__)}
    return {name: mod for name, mod in found.items() if callable(getattr(mod, "run", None))}


def test_every_pipeline_runs_with_one_context():
    mods = _modules_with_run()
    assert RUNNABLE <= set(mods), sorted(mods)
    for name, mod in mods.items():
        run = mod.run
        assert list(inspect.signature(run).parameters) == ["ctx"], name
        assert typing.get_type_hints(run)["ctx"] is PipelineContext, name
