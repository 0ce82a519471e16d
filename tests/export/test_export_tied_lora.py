"""forge export of a LoRA adapter on lm_head over a base that ties its head to the input embeddings
(as forge serve's train_unembed trains on the tiny Llama, Llama 3.2 1B): the export stores the adapted
head beside the unchanged embedding, unties them in config.json, and gives PEFT's logits."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from export_fixtures import save_tiny
from forge import cli
from forge.errors import ForgeError
from forge.export.layout import ExportOptions, export
from forge.export.source import resolve

IDS = torch.tensor([[1, 5, 9, 17, 3, 8]])


def _tied_base_and_adapter(tiny_checkpoint, tmp_path, save_embedding_layers=True):
    """A tiny Llama whose head is tied, and a PEFT LoRA on q_proj and lm_head with nonzero B, saved
    beside it; returns (base folder, adapter folder, the PEFT model's fp32 logits on IDS)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = save_tiny("llama", tmp_path / "base", tiny_checkpoint, tie_word_embeddings=True)
    assert json.loads((base / "config.json").read_text())["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(str(base / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(2)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"],
                                            init_lora_weights=False)).eval()
    with torch.no_grad():
        want = peft(input_ids=IDS).logits
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(input_ids=IDS).logits
    assert (want - plain).abs().max() > 0.1  # the adapter changes the logits, the head's delta among them
    adapter = tmp_path / "adapter"
    # PEFT's default also saves the head's base layer (the embedding, as the tied base has it); forge serve does not
    peft.save_pretrained(str(adapter), save_embedding_layers=save_embedding_layers)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    return base, adapter, want


@pytest.mark.parametrize("fmt,save_embedding_layers", [("hf", True), ("bedrock", False)])
def test_a_head_adapter_on_a_tied_base_exports_untied(fmt, save_embedding_layers, tiny_checkpoint, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    base, adapter, want = _tied_base_and_adapter(tiny_checkpoint, tmp_path, save_embedding_layers)
    out = tmp_path / "export"
    assert cli.main(["export", str(adapter), "--out", str(out), "--format", fmt, "--dtype", "fp16", "--verify"]) == 0, \
        capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    manifest = json.loads((out / "forge-manifest.json").read_text())
    assert manifest["config_changes"]["set"] == {"tie_word_embeddings": False}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" in index["weight_map"]
    tensors = {k: v for f in set(index["weight_map"].values()) for k, v in load_file(str(out / f)).items()}
    assert set(tensors) == set(index["weight_map"])
    embedding = load_file(str(base / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(tensors["model.embed_tokens.weight"], embedding.half())  # the embedding is the base's
    adapted = load_file(str(adapter / "adapter_model.safetensors"))
    a, b = adapted["base_model.model.lm_head.lora_A.weight"], adapted["base_model.model.lm_head.lora_B.weight"]
    assert torch.equal(tensors["lm_head.weight"], (embedding + b @ a * 8 / 4).half())

    got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert got.lm_head.weight.data_ptr() != got.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        logits = got(input_ids=IDS).logits
    # fp16 weights: each within 2^-11 of PEFT's, the logits a few such roundings from its
    assert torch.allclose(logits, want, rtol=1e-2, atol=2e-3), (logits - want).abs().max()
    assert manifest["verification"]["max_relative_logit_error"] < 2 ** -7


def test_a_tied_base_whose_architecture_transformers_does_not_know_is_refused(tiny_checkpoint, tmp_path):
    """A custom-code base (auto_map, an architecture of its own): forge cannot tell which tensor it
    ties the head to, so it says so before writing anything."""
    base, adapter, _ = _tied_base_and_adapter(tiny_checkpoint, tmp_path)
    config = json.loads((base / "config.json").read_text())
    config["architectures"] = ["AcmeForCausalLM"]
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"}
    (base / "config.json").write_text(json.dumps(config))
    with pytest.raises(ForgeError, match=r"adapter: adapts lm_head.weight, which .*config.json ties to the input "
                       r"embeddings; .*expected architectures\[0\] to be a transformers model class, got "
                       r"'AcmeForCausalLM'"):
        export(resolve(str(adapter), None, tmp_path / "work"), tmp_path / "e", ExportOptions(format="hf"),
               log=lambda *_: None)
    assert not (tmp_path / "e").exists()


def test_a_tied_base_that_also_stores_a_head_is_untied_from_its_embedding(tiny_checkpoint, tmp_path):
    """Some tied checkpoints store lm_head.weight too; the model computes its logits with the
    embedding, so the merged head is the embedding plus the delta, whatever the stored head holds."""
    from safetensors.torch import save_file

    from forge.export.source import merge_lora, untied_head

    base, adapter, _ = _tied_base_and_adapter(tiny_checkpoint, tmp_path, save_embedding_layers=False)
    weights = load_file(str(base / "model.safetensors"))
    weights["lm_head.weight"] = torch.randn_like(weights["model.embed_tokens.weight"])
    save_file(weights, str(base / "model.safetensors"), metadata={"format": "pt"})
    assert untied_head(resolve(str(adapter), None, tmp_path / "work")) == "model.embed_tokens.weight"
    merged = list(merge_lora(adapter, base))
    assert [n for n, _ in merged].count("lm_head.weight") == 1 and merged[-1][0] == "lm_head.weight"
    adapted = load_file(str(adapter / "adapter_model.safetensors"))
    a, b = adapted["base_model.model.lm_head.lora_A.weight"], adapted["base_model.model.lm_head.lora_B.weight"]
    embedding = weights["model.embed_tokens.weight"]
    assert torch.allclose(merged[-1][1], embedding + b @ a * 8 / 4)
    assert torch.equal(dict(merged)["model.embed_tokens.weight"], embedding)
