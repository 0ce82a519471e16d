"""recipes/quickstart.yaml end to end on a tiny budget, from a tiny forge-tiny foundation written
in FORGE_HOME the way pipelines/foundation.py leaves it: the stages run, the suite measures fact
recall per split, general perplexity and instruction following on start and Novella, the Novella is
registered and exported for Bedrock, and the printed start-versus-Novella figures are those in
MLflow."""
from __future__ import annotations

import json
import re

import pytest

from catalog_testing import write_tiny_foundation
from forge import cli
from forge.recipe import load_recipe
from forge_testing import REPO

# the real recipe, shrunk: few documents and steps, the tiny model's context, a few questions
TINY = ["data.kb_docs.generate.documents=40", "data.kb_qa.generate.documents=60", "data.kb_eval.generate.documents=28",
        "stages[0].max_tokens=2048", "stages[0].seq_len=64", "stages[0].batch_size=4", "stages[1].max_tokens=null",
        "stages[1].max_steps=2",
        "stages[1].seq_len=128", "stages[1].batch_size=4", "stages[1].schedule.warmup_steps=0",
        "eval.fact_recall.max_new_tokens=4", "eval.instruct.max_new_tokens=4", "eval.instruct.limit=3",
        "eval.max_blocks=2", "eval.seq_len=32"]
LINE = re.compile(r"^  (?P<text>.+?)  +(?P<shown>\S+ -> \S+) +\((?P<metric>[\w.]+): (?P<start>\S+) -> (?P<novella>\S+)\)$")


@pytest.mark.slow
def test_quickstart_prints_what_mlflow_holds(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))
    write_tiny_foundation(tmp_path / "forge-home", tiny_checkpoint)
    overrides = [*TINY, f"output={tmp_path / 'run'}"]
    assert cli.main(["run", str(REPO / "recipes" / "quickstart.yaml"), *overrides]) == 0
    out = capsys.readouterr().out
    head = out.index("quickstart: start -> Novella")
    printed = {m["metric"]: m for m in map(LINE.match, out[head:].splitlines()[1:]) if m}
    assert set(printed) == {"fact_recall.heldout.exact", "fact_recall.train.exact", "fact_recall.doconly.exact",
                            "fact_recall.stated.exact", "ppl.general", "retention.general", "instruct.accuracy"}, out[head:]

    import mlflow

    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    mlflow.set_tracking_uri(recipe.tracking_uri)
    parent = mlflow.search_runs(experiment_names=["quickstart"], filter_string="tags.`forge.pipeline` = 'novella'",
                                output_format="list")[0]
    params = parent.data.params
    for metric, m in printed.items():
        assert m["start"] == params[f"quickstart.start.{metric}"], metric
        assert m["novella"] == params[f"quickstart.novella.{metric}"] == params[f"suite.{metric}"], metric
    # the comparison the suite logged holds the same start figures, unrounded
    comparison = json.loads(mlflow.artifacts.load_text(f"runs:/{parent.info.run_id}/eval/comparison.json"))
    start = next(m["metrics"] for m in comparison["models"] if m["label"] == "start")
    assert float(params["quickstart.start.fact_recall.heldout.exact"]) == pytest.approx(
        start["fact_recall.heldout.exact"], abs=5e-4)
    # the first 28 facts: 24 of asked products, each asked once per split, and 4 of a document-only one
    # (asked, and its sentences completed)
    novella = comparison["models"][-1]["metrics"]
    assert {round(novella[f"fact_recall.{s}.exact"] * n, 6) % 1 for s, n in (("train", 24), ("heldout", 24),
                                                                             ("doconly", 4), ("stated", 4))} == {0}

    export = tmp_path / "run-bedrock"
    manifest = json.loads((export / "forge-manifest.json").read_text())
    assert manifest["format"] == "bedrock" and manifest["names"]["importedModelName"] == "quickstart"
    assert params["quickstart.export"] == str(export)
    version = mlflow.MlflowClient().get_model_version("quickstart", "1")
    assert version.tags["exported_uri"] == export.resolve().as_uri()
    gates = [line for line in out.splitlines() if line.startswith("gate ")]
    assert any("fact_recall.heldout.exact" in g for g in gates) and any("retention.general" in g for g in gates)
