"""Denormal floats flushed to zero while a stage trains on a CPU: in every torch thread (an
elementwise op over a large tensor runs on all of them), undone after, each thread back to its own
setting, and off where the stage says `flush_denormals: false`."""
from __future__ import annotations

import pytest
import torch

import forge.train.loop as loop
from forge.recipe import PretrainStage
from forge.train.denormals import flush_denormals, flushing
from forge_testing import pretrain_stage, run_stage

TINY = 1e-39  # below float32's smallest normal number (1.18e-38)


@pytest.fixture
def two_threads():
    """Two intra-op threads, so that a large elementwise op is split between the calling thread and
    an OpenMP worker."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
    torch.set_flush_denormal(False)


def zeros_of(x: torch.Tensor) -> int:
    return int(((x * 1.0) == 0).sum())  # a denormal times one is itself, or zero where flushed


def test_every_thread_flushes_inside_and_none_after(two_threads):
    x = torch.full((1 << 20,), TINY)
    assert x[0].item() != 0 and zeros_of(x) == 0
    with flush_denormals():
        assert zeros_of(x) == x.numel()  # the worker's half as well as the calling thread's
        assert flushing()
    assert zeros_of(x) == 0 and not flushing()


def test_a_thread_gets_back_its_own_setting(two_threads):
    x = torch.full((1 << 20,), TINY)  # made before: a flushing thread would store zeros
    torch.set_flush_denormal(True)  # the calling thread only: OpenMP's worker keeps its own (off)
    assert 0 < zeros_of(x) < x.numel()
    with flush_denormals():
        assert zeros_of(x) == x.numel()
    assert flushing() and 0 < zeros_of(x) < x.numel()


def test_disabled_changes_nothing(two_threads):
    with flush_denormals(enabled=False):
        assert zeros_of(torch.full((1 << 20,), TINY)) == 0 and not flushing()


@pytest.mark.parametrize("setting", [True, False])
def test_a_cpu_stage_trains_flushing_unless_it_says_not(setting, tmp_path, monkeypatch, tiny_checkpoint,
                                                        generated_sources):
    seen = []
    real = loop.train_step

    def watched(*args, **kwargs):
        seen.append(flushing())
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", watched)
    stage = PretrainStage(**pretrain_stage(max_steps=2, flush_denormals=setting))
    run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "out")
    assert seen == [setting, setting]
    assert not flushing()  # the stage leaves the process as it found it
