"""The suite runner: figures relative to the first model, the time budget, unknown sources."""
from __future__ import annotations

import pytest

from forge.errors import ForgeError
from forge.eval.suite import resolve_suite, run_suite
from forge.recipe import DataSource, PretrainStage
from forge.recipe.eval import EvalBlock
from forge_testing import pretrain_stage


def test_defaults_come_from_the_recipe():
    stages = [PretrainStage(**pretrain_stage(mixture={"general": 0.5, "domain": 0.5}, separator="bos", seq_len=64))]
    data = {"general": DataSource(path="x.txt"), "domain": DataSource(path="y.txt", proprietary=True),
            "unused": DataSource(path="z.txt")}
    suite = resolve_suite(None, stages, data)
    assert (suite.domain, suite.general, suite.seq_len, suite.separator) == (["domain"], ["general"], 64, "bos")


def test_relative_figures_and_time_budget(tiny_checkpoint, generated_sources):
    suite = EvalBlock(domain=["domain"], general=["general"], seq_len=32, max_blocks=2, separator="eos")
    c = run_suite({"start": tiny_checkpoint, "same": tiny_checkpoint}, suite, generated_sources, log=lambda *_: None)
    assert c.metrics["same"]["retention.general"] == 0.0 and c.metrics["same"]["domain_gain.domain"] == 0.0
    assert c.metrics["start"]["ppl.domain"] > 1.0 and not c.skipped
    rushed = run_suite({"start": tiny_checkpoint}, suite.model_copy(update={"time_budget_s": 1e-9}),
                       generated_sources, log=lambda *_: None)
    assert rushed.skipped == ["start: perplexity"] and rushed.metrics["start"] == {}
    with pytest.raises(ForgeError, match="unknown data source"):
        run_suite({"start": tiny_checkpoint}, EvalBlock(domain=["nope"], general=[], seq_len=32, separator="eos"),
                  generated_sources)
