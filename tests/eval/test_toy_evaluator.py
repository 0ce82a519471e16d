"""An evaluator added from inside a test, touching no other file: a settings block (an
EvaluatorSettings with `block: ClassVar[str] = "toy"`, which `eval:` then accepts as `eval.toy`),
a prepare and a measure function (below) and a row of forge.eval.table.EVALUATORS. It is validated,
listed by `forge eval --help`, run by `forge eval` and logged to MLflow like the built-in ones."""
from __future__ import annotations

import json
from itertools import islice
from typing import ClassVar

import pytest
from pydantic import Field

from forge import cli
from forge.eval.table import EVALUATORS, Context, Evaluator, Model
from forge.recipe import EvalBlock, load_recipe
from forge.recipe.registry import BLOCKS, EvaluatorSettings
from forge.track.names import summary_value
from forge_testing import base_recipe, pretrain_stage, write_recipe


def prepare(settings, ctx: Context) -> list[str]:
    """Once, before any model loads: the first `limit` texts of the block's source."""
    return [text for _, text in islice(ctx.sources[settings.source].records(), settings.limit)]


def measure(model: Model, settings, ctx: Context) -> dict[str, float]:
    """Per model: its mean tokens per text and its parameter count."""
    tokens = [len(model.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in ctx.prepared]
    return {"toy.tokens_per_text": sum(tokens) / len(tokens),
            "toy.parameters": float(sum(p.numel() for p in model.model.parameters()))}


@pytest.fixture
def toy_evaluator(monkeypatch):
    class ToyBlock(EvaluatorSettings):
        """A toy evaluator: token counts of a source's first texts, and the model's size."""

        block: ClassVar[str] = "toy"
        source: str
        limit: int = Field(3, gt=0)

    monkeypatch.setitem(EVALUATORS, "toy", Evaluator("toy", "a toy's token counts and model size",
                                                     f"{__name__}:measure", f"{__name__}:prepare"))
    yield ToyBlock
    BLOCKS.pop("toy", None)  # defining the class registered it with the eval: schema


def _recipe(tmp_path, toy: dict, **kw):
    return write_recipe(tmp_path / "r.yaml", base_recipe(
        tmp_path, stages=[pretrain_stage(max_steps=2)], eval={"max_blocks": 2, "toy": toy, **kw}))


@pytest.mark.slow
def test_a_toy_evaluator_runs_in_forge_run_and_forge_eval_and_reaches_mlflow(toy_evaluator, tmp_path, capsys):
    import mlflow

    path = _recipe(tmp_path, {"source": "general", "limit": 4})
    assert isinstance(load_recipe(path).eval.block("toy"), toy_evaluator)
    assert cli.main(["run", str(path)]) == 0
    out = tmp_path / "out"
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    parent = mlflow.search_runs(experiment_names=["tiny"], filter_string="tags.`forge.pipeline` = 'novella'",
                                output_format="list")[0]
    assert "suite.toy.parameters" in parent.data.params  # forge run's own evaluation of the Novella

    report = tmp_path / "eval.json"
    assert cli.main(["eval", str(path), "--json", str(report)]) == 0
    figures = {m["label"]: m["metrics"] for m in json.loads(report.read_text())["models"]}
    assert list(figures) == ["start", "novella"]
    assert figures["start"]["toy.parameters"] == figures["novella"]["toy.parameters"] > 0
    assert figures["novella"]["toy.tokens_per_text"] > 1  # the figures after perplexity's, in the table's order
    assert list(figures["novella"]).index("toy.parameters") > list(figures["novella"]).index("ppl.general")
    run = mlflow.search_runs(experiment_names=["tiny"], filter_string="tags.`forge.pipeline` = 'eval'",
                             output_format="list")[0]
    assert run.data.tags["forge.eval_of"] == parent.info.run_id
    for name in ("toy.tokens_per_text", "toy.parameters"):  # params as people read them: 4 digits, 1,000s
        assert run.data.params[f"suite.{name}"] == summary_value(figures["novella"][name]), name


def test_a_toy_evaluator_on_any_model_and_its_gate(toy_evaluator, tiny_checkpoint, tmp_path, capsys):
    spec = {"data": {"general": {"generate": {"kind": "stories", "documents": 40}}},
            "eval": {"domain": [], "general": [], "seq_len": 32, "toy": {"source": "general"},
                     "gates": {"max": {"toy.parameters": 1.0}}}}
    suite = write_recipe(tmp_path / "suite.yaml", spec)
    report = tmp_path / "eval.json"
    args = ["eval", "--models", str(tiny_checkpoint), "--suite", str(suite), "--json", str(report)]
    assert cli.main(args) == 0 and cli.main([*args, "--strict"]) == 1  # the gate fails
    figures = json.loads(report.read_text())["models"][0]["metrics"]
    assert set(figures) == {"toy.tokens_per_text", "toy.parameters"}  # nothing else asked for


def test_a_toy_block_is_validated_like_the_others(toy_evaluator, tmp_path, capsys):
    assert cli.main(["validate", str(_recipe(tmp_path, {"source": "nope"}))]) == 2
    assert "eval: unknown data source 'nope'" in capsys.readouterr().err
    assert cli.main(["validate", str(_recipe(tmp_path, {"source": "general", "limit": 0}))]) == 2
    assert "eval.toy.limit: Input should be greater than 0 (given: 0)" in capsys.readouterr().err
    assert cli.main(["validate", str(_recipe(tmp_path, {"source": "general", "limt": 2}, toi={}))]) == 2
    err = capsys.readouterr().err
    assert "eval.toy.limt: unknown key; expected one of ['limit', 'source']" in err
    assert "eval.toi: unknown key" in err and "'toy'" in err.split("eval.toi: unknown key")[1]
    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    assert "  toy: a toy's token counts and model size" in capsys.readouterr().out


def test_every_row_names_a_block_eval_accepts():
    accepted = set(EvalBlock.model_fields) | set(BLOCKS)
    assert set(EVALUATORS) <= accepted
    assert {ev.block for ev in EVALUATORS.values()} == set(EVALUATORS)
