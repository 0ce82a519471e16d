"""Parameter counts from config.json alone equal transformers' num_parameters() and published sizes."""
import json

import pytest

from forge.errors import ForgeError
from forge.plan.model import count_parameters, load_model_config, spec_from_config
from plan_fixtures import ARCHS, LLAMA_31_8B, LLAMA_31_70B, MISTRAL_7B_V01, MIXTRAL_8X7B, QWEN25_7B, tiny_model


@pytest.mark.parametrize("gqa", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_match_num_parameters(arch, gqa):
    model, cfg = tiny_model(arch, gqa)
    assert count_parameters(spec_from_config(cfg)).total == model.num_parameters()


def test_mixtral_active_parameters_count_top_k_experts():
    model, cfg = tiny_model("mixtral")
    spec = spec_from_config(cfg)
    pc = count_parameters(spec)
    experts = model.model.layers[0].mlp.experts
    per_expert = sum(p.numel() for p in experts.parameters()) // spec.experts
    assert pc.total - pc.active == spec.layers * (spec.experts - spec.top_k) * per_expert


@pytest.mark.parametrize("cfg,published", [
    (LLAMA_31_8B, 8_030_261_248),      # meta-llama/Llama-3.1-8B
    (LLAMA_31_70B, 70_553_706_496),    # meta-llama/Llama-3.1-70B
    (MISTRAL_7B_V01, 7_241_732_096),   # mistralai/Mistral-7B-v0.1
    (QWEN25_7B, 7_615_616_512),        # Qwen/Qwen2.5-7B
    (MIXTRAL_8X7B, 46_702_792_704),    # mistralai/Mixtral-8x7B-v0.1
])
def test_published_totals(cfg, published):
    assert count_parameters(spec_from_config(cfg)).total == published


def test_mixtral_active_is_about_12_9b():
    assert count_parameters(spec_from_config(MIXTRAL_8X7B)).active == 12_879_925_248


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(ForgeError, match="supported: llama"):
        spec_from_config({"model_type": "t5"})


def test_config_from_checkpoint_dir_and_preset(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    assert load_model_config(tmp_path) == LLAMA_31_8B
    assert load_model_config(tmp_path / "config.json") == LLAMA_31_8B
    preset = load_model_config("llama-3.1-8b")
    assert count_parameters(spec_from_config(preset)).total == 8_030_261_248
    with pytest.raises(ForgeError, match="preset"):
        load_model_config(tmp_path / "missing")
