"""Crash and resume: a resumed stage ends with the weights and data an uninterrupted one has."""
from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from forge import cli
from forge.recipe import PretrainStage, load_recipe
from forge_testing import Crash, base_recipe, crash_after as _crash_after, pretrain_stage, run_stage, write_recipe


def test_resumed_stage_equals_uninterrupted(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=6, checkpoint={"every": 2}, schedule={"kind": "cosine"},
                                           mixture={"general": 0.5, "domain": 0.5}, optim={"lr": 3e-3}))
    straight = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "a")

    with monkeypatch.context() as m:
        _crash_after(m, 5)  # steps 1-5 draw batches 1-5; step 6's batch crashes, after the step-4 checkpoint
        with pytest.raises(Crash):
            run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "b")
    assert not (tmp_path / "b" / "final").exists()
    resumed = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "b", resume=True)

    a = load_file(straight.checkpoint / "model.safetensors")
    b = load_file(resumed.checkpoint / "model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)  # bitwise
    assert resumed.tokens_by_source == straight.tokens_by_source
    assert resumed.metrics["eval_loss_start"] == straight.metrics["eval_loss_start"]
    assert resumed.metrics["eval_loss"] == straight.metrics["eval_loss"]


@pytest.mark.slow
def test_forge_run_resume_reuses_finished_stages(tmp_path, monkeypatch):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage("one", max_steps=3),
                                           pretrain_stage("two", max_steps=4, checkpoint={"every": 2})],
                         tracking={"register_model": False})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    with monkeypatch.context() as m:
        _crash_after(m, 3 + 3)  # stage one takes 3 batches, stage two crashes on its 4th
        assert cli.main(["run", str(path)]) == 1
    first_final = tmp_path / "out" / "stages" / "one" / "final" / "model.safetensors"
    stamp = first_final.stat().st_mtime_ns
    assert cli.main(["run", str(path), "--resume"]) == 0
    assert first_final.stat().st_mtime_ns == stamp  # stage one was not trained again
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    assert [s["steps"] for s in lineage["stages"]] == [3, 4]
    assert sum(lineage["stages"][1]["tokens_by_source"].values()) == 4 * 4 * 32
    assert load_recipe(path).stages[1].name == "two"
