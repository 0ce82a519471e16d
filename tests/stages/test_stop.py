"""Graceful stops and divergence: a signal ends a stage with a resumable checkpoint, a second
signal stops at once, and a diverging loss stops (or skips) naming the step."""
from __future__ import annotations

import math
import signal

import pytest
import torch
from safetensors.torch import load_file

from forge.recipe import PretrainStage
from forge.stages import pretrain
from forge.train.signals import GracefulStop, StopRequested
from forge.train.step import Divergence
from forge_testing import pretrain_stage, run_stage


def _loss_hook(monkeypatch, at_call: int, action):
    """Wrap the stage's loss: on call number `at_call` (1-based), `action(loss)` replaces it."""
    real, calls = pretrain.causal_lm_loss, {"n": 0}

    def hooked(model, batch):
        calls["n"] += 1
        loss = real(model, batch)
        return action(loss) if calls["n"] == at_call else loss

    monkeypatch.setattr(pretrain, "causal_lm_loss", hooked)


def test_signal_checkpoints_and_resume_is_bitwise(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=6, schedule={"kind": "cosine"}, optim={"lr": 3e-3}))
    straight = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "a")

    def interrupt(loss):
        signal.raise_signal(signal.SIGINT)  # as if Ctrl+C arrived during step 3
        return loss

    with monkeypatch.context() as m:
        _loss_hook(m, 3, interrupt)
        with pytest.raises(StopRequested, match="after step 3") as info:
            run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "b")
    assert info.value.checkpoint.name == "step-0000003"
    assert not (tmp_path / "b" / "final").exists()
    resumed = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "b", resume=True)
    a, b = (load_file(r.checkpoint / "model.safetensors") for r in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_second_signal_stops_at_once():
    with GracefulStop(announce=lambda msg: None) as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    with GracefulStop(announce=lambda msg: None):
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(SystemExit) as info:
            signal.raise_signal(signal.SIGTERM)
    assert info.value.code == 128 + signal.SIGTERM


def test_nan_loss_stops_the_stage_naming_the_step(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=6, checkpoint={"every": 2}))
    _loss_hook(monkeypatch, 5, lambda loss: loss * math.nan)
    with pytest.raises(Divergence, match=r"loss became nan at step 5.*last good checkpoint: .*step-0000004"):
        run_stage(stage, tiny_checkpoint, generated_sources, tmp_path)
    assert (tmp_path / "checkpoints" / "step-0000004").is_dir()
    assert not (tmp_path / "final").exists()


def test_nan_batch_is_skipped_when_asked(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=4, guard={"action": "skip"}))
    _loss_hook(monkeypatch, 2, lambda loss: loss * math.nan)
    result = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path)
    assert result.metrics["guard_skipped_steps"] == 1 and math.isfinite(result.metrics["loss"])
    weights = load_file(result.checkpoint / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_loss_spike_stops_the_stage(tmp_path, monkeypatch, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=8, guard={"spike_factor": 3, "window": 3}))
    _loss_hook(monkeypatch, 6, lambda loss: loss * 100)
    with pytest.raises(Divergence, match=r"spiked above 3 x its running mean .* at step 6"):
        run_stage(stage, tiny_checkpoint, generated_sources, tmp_path)
