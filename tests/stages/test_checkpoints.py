"""Checkpoints of this run only: stale ones from an earlier run in the same folder are never
resumed, damaged ones are skipped by hash, and keep_last_n retention."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from forge.errors import ForgeError
from forge.recipe import PretrainStage
from forge_testing import Crash, crash_after, pretrain_stage, run_stage


def _same_weights(a, b) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_checkpoints_of_an_earlier_run_are_never_resumed(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    earlier = PretrainStage(**pretrain_stage(max_steps=8, checkpoint={"every": 2}))
    run_stage(earlier, tiny_checkpoint, generated_sources, tmp_path / "b")  # leaves step-2, -4, -6
    now = PretrainStage(**pretrain_stage(max_steps=4, checkpoint={"every": 2}, optim={"lr": 1e-3}))
    straight = run_stage(now, tiny_checkpoint, generated_sources, tmp_path / "a")
    with monkeypatch.context() as m:
        crash_after(m, 3)  # step 4's batch crashes, after this run's step-2 checkpoint
        with pytest.raises(Crash):
            run_stage(now, tiny_checkpoint, generated_sources, tmp_path / "b")
    resumed = run_stage(now, tiny_checkpoint, generated_sources, tmp_path / "b", resume=True)
    assert resumed.steps == 4 and math.isfinite(resumed.metrics["loss"])
    assert _same_weights(straight.checkpoint, resumed.checkpoint)


def test_resume_point_past_the_stage_end_is_refused(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    long = PretrainStage(**pretrain_stage(max_steps=8, checkpoint={"every": 3}))
    with monkeypatch.context() as m:
        crash_after(m, 7)  # step-3 and step-6 written
        with pytest.raises(Crash):
            run_stage(long, tiny_checkpoint, generated_sources, tmp_path)
    short = PretrainStage(**pretrain_stage(max_steps=4, checkpoint={"every": 3}))
    with pytest.raises(ForgeError, match=r"step-0000006.*step 6.*only 4 steps"):
        run_stage(short, tiny_checkpoint, generated_sources, tmp_path, resume=True)


def test_damaged_newest_checkpoint_falls_back_and_keep_last_n(tmp_path, monkeypatch, tiny_checkpoint,
                                                              generated_sources):
    from forge.train.checkpoint import finished_result, latest_checkpoint

    stage = PretrainStage(**pretrain_stage(max_steps=7, checkpoint={"every": 2, "keep_last_n": 2}))
    with monkeypatch.context() as m:
        crash_after(m, 6)  # step-2, -4, -6 written; keep_last_n: 2 leaves -4 and -6
        with pytest.raises(Crash):
            run_stage(stage, tiny_checkpoint, generated_sources, tmp_path)
    steps = tmp_path / "checkpoints"
    assert sorted(p.name for p in steps.iterdir()) == ["step-0000004", "step-0000006"]
    weights = steps / "step-0000006" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of a weight: only the hash can tell
    weights.write_bytes(bytes(data))
    warnings = []
    assert latest_checkpoint(steps, warn=warnings.append) == steps / "step-0000004"
    assert "step-0000006" in warnings[0] and "model.safetensors" in warnings[0]
    result = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path, resume=True)
    assert result.steps == 7 and finished_result(result.checkpoint) is not None
    (result.checkpoint / "config.json").write_text("{}")
    assert finished_result(result.checkpoint) is None  # a damaged final checkpoint is never reused


def test_resume_point_is_taken_only_from_this_run(tmp_path):
    import json

    from forge.train.checkpoint import STATE, TRAINING, latest_checkpoint

    for step, run in ((2, "this"), (4, "this"), (6, "earlier")):
        folder = tmp_path / f"step-{step:07d}"
        folder.mkdir()
        (folder / STATE).write_text(json.dumps({"step": step, "run_id": run}))
        torch.save({}, folder / TRAINING)
    (tmp_path / "step-0000008.partial").mkdir()  # what a kill during a write leaves
    assert latest_checkpoint(tmp_path, "this") == tmp_path / "step-0000004"
    assert latest_checkpoint(tmp_path, "another") is None
