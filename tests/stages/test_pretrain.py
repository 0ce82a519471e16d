"""The continued-pretraining stage: learns, is deterministic, checkpoints, logs what it did."""
from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from forge.errors import ForgeError
from forge.recipe import PretrainStage
from forge_testing import pretrain_stage, run_stage


class FakeTracker:
    """Records what the stage logs (the stage only needs these methods)."""

    def __init__(self):
        self.metrics: list[tuple[int | None, dict]] = []
        self.tags: dict = {}

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def set_tags(self, tags):
        self.tags.update(tags)

    def history(self, key):
        return [(s, m[key]) for s, m in self.metrics if key in m]


def _stage(**kw) -> PretrainStage:
    return PretrainStage(**pretrain_stage(**kw))


def _run(stage, ckpt, sources, out):
    tracker = FakeTracker()
    return run_stage(stage, ckpt, sources, out, tracker), tracker


def test_loss_goes_down_and_eval_improves(tmp_path, tiny_checkpoint, generated_sources):
    stage = _stage(max_steps=30, log_every=1, optim={"lr": 1e-2}, eval={"every": 10, "max_blocks": 8})
    result, tracker = _run(stage, tiny_checkpoint, generated_sources, tmp_path)
    losses = [v for _, v in tracker.history("loss")]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert result.metrics["eval_loss"] < result.metrics["eval_loss_start"] - 1.0
    assert [s for s, _ in tracker.history("eval_loss")] == [0, 10, 20, 30]
    assert {"lr", "tokens_per_s", "grad_norm", "tokens.general"} <= set(tracker.metrics[1][1])


def test_same_seed_same_weights(tmp_path, tiny_checkpoint, generated_sources):
    stage = _stage(max_steps=3, grad_accum=2, mixture={"general": 0.5, "domain": 0.5})
    a, _ = _run(stage, tiny_checkpoint, generated_sources, tmp_path / "a")
    b, _ = _run(stage, tiny_checkpoint, generated_sources, tmp_path / "b")
    wa, wb = load_file(a.checkpoint / "model.safetensors"), load_file(b.checkpoint / "model.safetensors")
    base = load_file(tiny_checkpoint / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any(not (wa[k] == base[k]).all() for k in wa)  # and training did change them


def test_checkpoints_are_hf_folders_with_loader_state(tmp_path, tiny_checkpoint, generated_sources):
    from transformers import AutoModelForCausalLM

    stage = _stage(max_steps=4, checkpoint={"every": 2})
    result, _ = _run(stage, tiny_checkpoint, generated_sources, tmp_path)
    mid = tmp_path / "checkpoints" / "step-0000002"
    for folder in (mid, result.checkpoint):
        assert {"config.json", "model.safetensors", "tokenizer.json", "forge_state.json"} <= {p.name for p in folder.iterdir()}
        AutoModelForCausalLM.from_pretrained(folder)
    state = json.loads((mid / "forge_state.json").read_text())
    assert state["step"] == 2 and set(state["data"]["streams"]) == {"general"}
    assert not list(tmp_path.rglob("*.partial"))


def test_token_budget_sets_steps_and_shares(tmp_path, tiny_checkpoint, generated_sources):
    stage = _stage(max_steps=None, max_tokens=5000, batch_size=4, seq_len=32,
                   mixture={"general": 0.25, "domain": 0.75})
    result, _ = _run(stage, tiny_checkpoint, generated_sources, tmp_path)
    assert result.steps == 40  # ceil(5000 / 128)
    total = sum(result.tokens_by_source.values())
    assert total == 40 * 128
    assert abs(result.tokens_by_source["domain"] / total - 0.75) <= 0.01


def test_bf16_autocast_runs_on_cpu(tmp_path, tiny_checkpoint, generated_sources):
    result, _ = _run(_stage(max_steps=2, precision="bf16"), tiny_checkpoint, generated_sources, tmp_path)
    assert result.metrics["loss"] == result.metrics["loss"]  # finite, not NaN


def test_fp16_on_cpu_is_refused(tmp_path, tiny_checkpoint, generated_sources):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ForgeError, match="fp16 needs a GPU"):
        _run(_stage(precision="fp16"), tiny_checkpoint, generated_sources, tmp_path)
