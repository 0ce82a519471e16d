"""A real tiny `forge run` ends with the short summary: the terminal holds no line of key=value
figures (each stage's figures are in the run's log, OUTPUT/forge.log, and in MLflow), the summary
has a row per stage, start versus Novella against the first stage's output (the base is trained
from scratch), the gates and where things are."""
from __future__ import annotations

import json
import re

import mlflow
import pytest

from forge import cli
from forge_testing import base_recipe, pretrain_stage, write_recipe

PAIRS = re.compile(r"[\w./]+=[^\s,]+")


@pytest.mark.slow
def test_the_terminal_ends_with_the_summary_and_the_log_file_keeps_the_figures(tmp_path, capsys):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage("cpt", max_steps=2, eval={"max_blocks": 2}),
                                           pretrain_stage("dom", mixture={"domain": 1.0}, max_steps=2,
                                                          eval={"max_blocks": 2})],
                         eval={"max_blocks": 2, "seq_len": 32, "gates": {"retention_ppl_increase_max": 100.0,
                                                                         "domain_ppl_decrease_min": 0.99}})
    assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0  # a failed gate: 0 without --strict
    out = capsys.readouterr().out.splitlines()
    assert not [line for line in out if len(PAIRS.findall(line)) > 2], "key=value lines on the terminal"
    summary = out[next(i for i, line in enumerate(out) if line.startswith("summary: tiny, 2 stage(s) in ")):]
    assert all(len(line) <= 120 for line in summary if not line.startswith(("novella:", "mlflow:", "log:", "ui:")))
    rows = {line.split()[0]: line.split() for line in summary[2:4]}
    assert rows["cpt"][1:4] == ["pretrain", "2", "256"] and rows["dom"][1:4] == ["pretrain", "2", "256"]
    assert " ".join(rows["dom"]).endswith(f"eval loss: {' '.join(rows['dom'][-3:])}") and "->" in rows["dom"]
    assert "tiny: start -> Novella (start: cpt's output, as the base is trained from scratch)" in summary
    assert "gates: FAIL (1 of 2 failed)" in summary
    assert any(line.startswith("gate domain_ppl_decrease_min: domain_gain.domain = ") and "FAIL by" in line
               for line in summary)
    log = tmp_path / "out" / "forge.log"
    assert f"log:     {log} (every stage's figures, the full comparison)" in summary
    assert summary[-1].startswith("ui:      forge ui ")

    text = log.read_text()
    figures = [line for line in text.splitlines() if line.startswith("  dom: ")]
    assert figures and "eval_loss=" in figures[0] and "train_seconds=" in figures[0] and len(figures[0]) > 120
    assert "metric  " in text and text.rstrip().endswith(summary[-1])  # the full table, and the summary last

    # the comparison starts from the first stage's output, not the random initialisation
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    start = next(m for m in lineage["evaluation"]["models"] if m["label"] == "start")
    assert start["path"] == str(tmp_path / "out" / "stages" / "cpt" / "final")
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    parent = json.loads((tmp_path / "out" / "tracking.json").read_text())["parent"]
    assert "forge.log" in {a.path for a in client.list_artifacts(parent)}
