"""The stage family refactor left pretraining unchanged: the quickstart's first 20 steps give the
losses recorded with the code before it (tests/stages/quickstart20_reference.json)."""
from __future__ import annotations

import json
from pathlib import Path

from forge.inputs import prepare_inputs
from forge.recipe import load_recipe
from forge_testing import REPO, Recorder, run_stage

OVERRIDES = ["stages[0].max_tokens=null", "stages[0].max_steps=20", "stages[0].schedule.warmup_steps=5"]


def test_quickstart_first_20_steps_match_the_recorded_losses(tmp_path):
    reference = json.loads((Path(__file__).parent / "quickstart20_reference.json").read_text())
    recipe = load_recipe(REPO / "tests" / "stages" / "quickstart_reference.yaml", [*OVERRIDES, f"output={tmp_path}"])
    inputs = prepare_inputs(recipe, tmp_path)
    tracker = Recorder()
    result = run_stage(recipe.stages[0], inputs.base, inputs.sources, tmp_path / "stage", tracker)
    losses = [m["loss"] for _, m in tracker.rows if "loss" in m]
    assert len(losses) == 20
    for step, (got, want) in enumerate(zip(losses, reference["losses"]), start=1):
        assert abs(got - want) <= 1e-6, (step, got, want)
    assert abs(result.metrics["eval_loss_start"] - reference["eval_loss_start"]) <= 1e-6
    assert abs(result.metrics["eval_loss"] - reference["eval_loss"]) <= 1e-6
