"""forge export: the Bedrock layout for tiny Llama/Mistral/Qwen2 models and a real one, validation
before writing, the 4.51.3 config translation, the round trip, LoRA merging."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from export_fixtures import save_tiny
from forge.errors import ForgeError
from forge.export import bedrock
from forge.export.layout import ExportOptions, export, sha256
from forge.export.source import resolve
from forge.export.verify import verify
from forge_testing import shared_path


def _export(folder, out, tmp_path, **kw):
    return export(resolve(str(folder), None, tmp_path / "work"), out, ExportOptions(**kw), log=lambda *_: None)


def _tensors(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / file), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return index, out


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_tiny_models_export_validate_and_round_trip(kind, tiny_checkpoint, tmp_path):
    src = save_tiny(kind, tmp_path / kind, tiny_checkpoint)
    out = tmp_path / "export"
    manifest = _export(src, out, tmp_path, verify=True, max_shard_bytes=20_000)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "MODEL_CARD.md", "forge-manifest.json"} <= names
    index, tensors = _tensors(out)
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(tensors)
        for k in f.keys():  # every weight is the source's, rounded to bf16
            assert tensors[k].dtype == torch.bfloat16
            assert torch.equal(tensors[k], f.get_tensor(k).to(torch.bfloat16))
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
    config = json.loads((out / "config.json").read_text())
    assert "rope_parameters" not in config and "dtype" not in config and config["torch_dtype"] == "bfloat16"
    assert config["transformers_version"] == "4.51.3"
    if kind == "llama":
        assert config["rope_theta"] == 500000.0 and config["rope_scaling"]["rope_type"] == "llama3"
        assert config["rope_scaling"]["factor"] == 8.0 and "rope_theta" not in config["rope_scaling"]
    if kind == "qwen2":
        assert "layer_types" not in config and "layer_types" in manifest["config_changes"]["dropped"]
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in tok_config
    assert tok_config["chat_template"]  # inline, for the Converse API
    for name, entry in manifest["files"].items():
        assert sha256(out / name) == entry["sha256"] and (out / name).stat().st_size == entry["bytes"]
    assert set(manifest["files"]) == names - {"forge-manifest.json", ".forge-export"}  # the marker is written last
    ver = manifest["verification"]
    assert ver["max_relative_logit_error"] < ver["tolerance"] and ver["generated"]["tokens"] == 16


def test_qwen_chat_template_kept_and_default_used_otherwise(tiny_checkpoint, tmp_path):
    from export_fixtures import QWEN_TEMPLATE

    manifest = _export(save_tiny("qwen2", tmp_path / "q", tiny_checkpoint), tmp_path / "e1", tmp_path)
    assert json.loads((tmp_path / "e1/tokenizer_config.json").read_text())["chat_template"] == QWEN_TEMPLATE
    assert manifest["chat_template"] == "model"
    manifest = _export(save_tiny("llama", tmp_path / "l", tiny_checkpoint), tmp_path / "e2", tmp_path)
    assert manifest["chat_template"] == "default"
    assert json.loads((tmp_path / "e2/tokenizer_config.json").read_text())["chat_template"] == bedrock.DEFAULT_CHAT_TEMPLATE
    manifest = _export(tmp_path / "l", tmp_path / "e3", tmp_path, format="hf")
    assert manifest["chat_template"] == "none"
    assert "chat_template" not in json.loads((tmp_path / "e3/tokenizer_config.json").read_text())


def test_fp16_option(tiny_checkpoint, tmp_path):
    manifest = _export(save_tiny("mistral", tmp_path / "m", tiny_checkpoint), tmp_path / "e", tmp_path,
                       dtype="fp16", verify=True)
    _, tensors = _tensors(tmp_path / "e")
    assert {t.dtype for t in tensors.values()} == {torch.float16}
    assert json.loads((tmp_path / "e/config.json").read_text())["torch_dtype"] == "float16"
    assert manifest["verification"]["tolerance"] < 0.01


def test_gpt2_is_refused_with_the_supported_list(tiny_checkpoint, tmp_path):
    src = save_tiny("gpt2", tmp_path / "g", tiny_checkpoint)
    with pytest.raises(ForgeError) as e:
        _export(src, tmp_path / "e", tmp_path)
    message = str(e.value)
    assert "GPT2LMHeadModel is not supported" in message and "\n" not in message
    for arch, family in bedrock.rules()["architectures"].items():
        assert arch in message and family in message
    assert not (tmp_path / "e").exists()  # validation runs before anything is written
    _export(src, tmp_path / "hf", tmp_path, format="hf", verify=True)  # --format hf has no Bedrock rules
    assert (tmp_path / "hf/model.safetensors.index.json").is_file()


def test_context_size_tokenizer_and_names_are_checked(tiny_checkpoint, tmp_path, monkeypatch):
    src = save_tiny("llama", tmp_path / "long", tiny_checkpoint, max_position_embeddings=262144)
    with pytest.raises(ForgeError, match=r"max_position_embeddings is 262144; Bedrock supports contexts up to 131072"):
        _export(src, tmp_path / "e", tmp_path)
    src = save_tiny("qwen2", tmp_path / "q", tiny_checkpoint)
    with pytest.raises(ForgeError, match=r"importedModelName 'acme model!' is invalid"):
        _export(src, tmp_path / "e", tmp_path, model_name="acme model!")
    with pytest.raises(ForgeError, match=r"jobName '-job' is invalid"):
        _export(src, tmp_path / "e", tmp_path, job_name="-job")
    with pytest.raises(ForgeError, match="jobName"):
        _export(src, tmp_path / "e", tmp_path, job_name="j" * 64)
    limits = {**bedrock.rules(), "max_weight_bytes": 10_000}
    monkeypatch.setattr(bedrock, "rules", lambda: limits)
    with pytest.raises(ForgeError, match=r"Bedrock imports under"):
        _export(src, tmp_path / "e", tmp_path)
    monkeypatch.undo()
    tok_config = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps({**tok_config, "tokenizer_class": "BertTokenizerFast"}))
    with pytest.raises(ForgeError, match=r"tokenizer class BertTokenizerFast .* supported: PreTrainedTokenizerFast"):
        _export(src, tmp_path / "e", tmp_path)
    assert not (tmp_path / "e").exists()


def test_verify_catches_weights_that_differ(tiny_checkpoint, tmp_path):
    src_dir = save_tiny("llama", tmp_path / "l", tiny_checkpoint)
    _export(src_dir, tmp_path / "e", tmp_path)
    shard = tmp_path / "e" / "model-00001-of-00001.safetensors"
    tensors = load_file(str(shard))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name] * 3
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ForgeError, match="exported logits differ from the source"):
        verify(resolve(str(src_dir), None, tmp_path), tmp_path / "e", "bf16", log=lambda *_: None)


def test_real_model_stories260k(tmp_path):
    """A real checkpoint whose config.json and tokenizer_config.json were written by transformers 5."""
    src = shared_path("models", "stories260K")
    manifest = _export(src, tmp_path / "e", tmp_path, verify=True)
    config = json.loads((tmp_path / "e/config.json").read_text())
    assert config["rope_theta"] == 10000.0 and config["rope_scaling"] is None and "rope_parameters" not in config
    assert manifest["config_changes"]["renamed"] == {"rope_parameters": "rope_theta, rope_scaling", "dtype": "torch_dtype"}
    tok_config = json.loads((tmp_path / "e/tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "LlamaTokenizer" and "extra_special_tokens" not in tok_config
    assert not {"backend", "is_local", "local_files_only"} & set(tok_config)
    assert (tmp_path / "e/tokenizer.model").read_bytes() == (src / "tokenizer.model").read_bytes()
    # a real model generates real text through the exported weights
    assert "there was" in manifest["verification"]["generated"]["text"]
    assert manifest["verification"]["top1_agreement"] > 0.9


def test_lora_adapter_is_merged(tiny_checkpoint, tmp_path):
    base = save_tiny("llama", tmp_path / "base", tiny_checkpoint)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    torch.manual_seed(1)
    weights, r, alpha = {}, 4, 8
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            out_dim = 32 if proj == "q_proj" else 16
            weights[f"{prefix}.lora_A.weight"] = torch.randn(r, 32) * 0.2
            weights[f"{prefix}.lora_B.weight"] = torch.randn(out_dim, r) * 0.2
    save_file(weights, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "base_model_name_or_path": "../base", "r": r, "lora_alpha": alpha,
        "target_modules": ["q_proj", "v_proj"]}))
    manifest = _export(adapter, tmp_path / "e", tmp_path, verify=True)
    assert manifest["source"]["lora_base"] == str(base.resolve())
    _, tensors = _tensors(tmp_path / "e")
    base_w = load_file(str(base / "model.safetensors"))
    key = "model.layers.1.self_attn.q_proj.weight"
    prefix = "base_model.model.model.layers.1.self_attn.q_proj"
    expected = base_w[key] + (weights[f"{prefix}.lora_B.weight"] @ weights[f"{prefix}.lora_A.weight"]) * alpha / r
    assert torch.equal(tensors[key], expected.to(torch.bfloat16))
    assert not torch.equal(tensors[key], base_w[key].to(torch.bfloat16))
    k = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(tensors[k], base_w[k].to(torch.bfloat16))  # untouched modules stay the base's


def test_bad_job_request_is_refused_before_writing(tiny_checkpoint, tmp_path):
    src = save_tiny("qwen2", tmp_path / "q", tiny_checkpoint)
    with pytest.raises(ForgeError, match=r"bedrock-import-job.json: roleArn 'admin' does not match"):
        _export(src, tmp_path / "e", tmp_path, role_arn="admin", s3_uri="s3://forge-models/q/")
    with pytest.raises(ForgeError, match="use --format bedrock"):
        _export(src, tmp_path / "e", tmp_path, format="hf", role_arn="admin", s3_uri="s3://forge-models/q/")
    assert not (tmp_path / "e").exists()
    _export(src, tmp_path / "e", tmp_path, role_arn="arn:aws:iam::123456789012:role/Import",
            s3_uri="s3://forge-models/q/")
    request = json.loads((tmp_path / "e/bedrock-import-job.json").read_text())
    assert bedrock.request_problems(request) == [] and request["importedModelName"] == "q"


def test_cli_refusal_is_one_line(tiny_checkpoint, tmp_path, capsys):
    from forge import cli

    src = save_tiny("gpt2", tmp_path / "g", tiny_checkpoint)
    capsys.readouterr()  # transformers' own progress output while building the model
    assert cli.main(["export", str(src), "--out", str(tmp_path / "e")]) == 2
    first, err = capsys.readouterr().err.split("\n", 1)  # the command's first line, then the refusal
    assert first.startswith(f"forge export {src} -> ")
    assert err.startswith("forge: error: cannot export: architecture GPT2LMHeadModel is not supported")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert cli.main(["export", str(src), "--out", str(tmp_path / "e"), "--max-shard-size", "lots"]) == 2
    assert "--max-shard-size 'lots'" in capsys.readouterr().err
