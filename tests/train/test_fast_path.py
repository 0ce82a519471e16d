"""The fast path's switches and figures: MFU and achieved FLOP/s per logging window (in MLflow and
on the progress line), fused AdamW, `compile: true` per decoder layer, SDPA attention."""
from __future__ import annotations

import math
import re

import mlflow
import pytest
import torch
from safetensors.torch import load_file

from forge import cli
from forge.errors import ForgeError
from forge.plan.device_peak import chip_key_for_device, flops_per_token, peak_flops_for_device
from forge.plan.recipe_plan import recipe_model_config
from forge.recipe import PretrainStage, load_recipe
from forge.stages.result import StageInputs
from forge.train import attention
from forge.train.meter import Flops
from forge.train.optim import build_optimizer
from forge.train.session import open_session
from forge_testing import Recorder, base_recipe, pretrain_stage, run_stage, write_recipe


@pytest.mark.parametrize("name, key", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA B200", "b200"), ("cpu", None), ("NVIDIA A10G", None),
                                       ("NVIDIA H1000", None)])
def test_a_device_is_matched_to_its_catalog_chip_by_name(name, key):
    assert chip_key_for_device(name) == key


def test_peak_is_the_catalog_figure_at_the_precision():
    assert peak_flops_for_device("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops_for_device("NVIDIA H100 80GB HBM3", "fp4") is None  # no such figure
    assert peak_flops_for_device("cpu", "fp32") is None


def test_flops_per_token_is_the_planners_count():
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512}
    per_token = flops_per_token(cfg, 128)
    matmul = 2 * (4 * 64 * 64 + 3 * 64 * 128) + 512 * 64  # the layers' matrices and the head (a lookup is free)
    causal_attention = 12 * 2 * 64 * 128 / 2               # PaLM's 12·L·H·T, half of it under a causal mask
    assert per_token == 6 * matmul + causal_attention
    assert flops_per_token({"model_type": "no-such-model"}, 128) is None


def test_every_log_window_carries_mfu_from_its_tokens_per_second(tmp_path, tiny_checkpoint, generated_sources):
    from forge.kinds import KINDS

    tracker = Recorder()
    flops = Flops(per_token=2e6, peak=5e9)
    inputs = StageInputs(tiny_checkpoint, generated_sources, tmp_path, tracker, log=lambda *_: None, flops=flops)
    result = KINDS["pretrain"].runner()(PretrainStage(**pretrain_stage(max_steps=4, log_every=2)), inputs)
    windows = [row for _, row in tracker.rows if "tokens_per_s" in row]
    assert len(windows) == 2
    for row in windows:
        assert math.isclose(row["tflops_per_chip"], row["tokens_per_s"] * 2e6 / 1e12, rel_tol=1e-9)
        assert math.isclose(row["mfu"], row["tokens_per_s"] * 2e6 / 5e9, rel_tol=1e-9)
    mean = result.metrics["tokens_per_s_mean"]
    assert math.isclose(result.metrics["mfu_mean"], mean * 2e6 / 5e9, rel_tol=1e-9)


@pytest.mark.slow
def test_a_run_logs_achieved_flops_to_mlflow_and_mfu_on_a_catalog_chip(tmp_path, monkeypatch, capsys):
    import forge.stages.runner as runner

    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)]))
    monkeypatch.setattr(runner, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert cli.main(["run", str(path)]) == 0
    assert re.search(r"cpt: step 2/2 \(100%\), loss [\d.]+, tok/s [\d,]+, mfu \d+\.\d%", capsys.readouterr().err)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    stage = next(r for r in mlflow.search_runs(experiment_names=["tiny"], output_format="list")
                 if r.info.run_name == "cpt")
    history = mlflow.MlflowClient().get_metric_history(stage.info.run_id, "train/mfu")
    tps = mlflow.MlflowClient().get_metric_history(stage.info.run_id, "train/tokens_per_s")
    assert [m.step for m in history] == [m.step for m in tps] == [1, 2]
    assert all(0 < m.value < 1e-3 for m in history)  # a CPU vs 67 TFLOP/s
    recipe = load_recipe(path)
    per_token = flops_per_token(recipe_model_config(recipe), recipe.stages[0].seq_len)
    assert per_token is not None
    for m, t in zip(history, tps):  # fp32 on an H100: its 67 TFLOP/s fp32 peak
        assert math.isclose(m.value, t.value * per_token / 67e12, rel_tol=1e-6)


def test_fused_adamw_is_the_default_on_an_accelerator_and_refused_where_torch_has_none():
    model = torch.nn.Linear(4, 4)
    assert not build_optimizer(model, _optim(None), torch.device("cpu")).defaults.get("fused")  # CPU: as before
    assert build_optimizer(model, _optim(True), torch.device("cpu")).defaults["fused"] is True  # asked: given
    meta = torch.nn.Linear(4, 4, device="meta")  # a device torch has no fused kernel for
    assert not build_optimizer(meta, _optim(None), torch.device("meta")).defaults.get("fused")  # default: falls back
    with pytest.raises(ForgeError, match="optim.fused: true: torch has no fused AdamW for meta devices; remove optim.fused"):
        build_optimizer(meta, _optim(True), torch.device("meta"))


def test_fused_adamw_trains_as_the_per_tensor_loop_does(tmp_path, tiny_checkpoint, generated_sources):
    plain = run_stage(PretrainStage(**pretrain_stage(max_steps=4)), tiny_checkpoint, generated_sources, tmp_path / "a")
    fused = run_stage(PretrainStage(**pretrain_stage(max_steps=4, optim={"lr": 3e-3, "fused": True})),
                      tiny_checkpoint, generated_sources, tmp_path / "b")
    assert abs(plain.metrics["loss"] - fused.metrics["loss"]) < 1e-5


@pytest.mark.slow
def test_compile_compiles_each_decoder_layer_and_trains_as_eager(tmp_path, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=3, compile=True))
    s = open_session(stage, StageInputs(tiny_checkpoint, {}, tmp_path / "s", None))
    layers = s.unwrapped().model.layers
    assert all(hasattr(layer.forward, "compiled") for layer in layers)
    eager = run_stage(PretrainStage(**pretrain_stage(max_steps=3)), tiny_checkpoint, generated_sources, tmp_path / "a")
    compiled = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "b")
    assert abs(eager.metrics["loss"] - compiled.metrics["loss"]) < 1e-4
    assert set(load_file(compiled.checkpoint / "model.safetensors")) == set(load_file(eager.checkpoint / "model.safetensors"))


def test_models_load_with_sdpa_attention(tmp_path, tiny_checkpoint):
    s = open_session(PretrainStage(**pretrain_stage(max_steps=1)), StageInputs(tiny_checkpoint, {}, tmp_path, None))
    assert s.unwrapped().config._attn_implementation == attention.NAME  # SDPA, packed rows one causal row each


def _optim(fused):
    from forge.recipe.settings import Optim

    return Optim(fused=fused)
