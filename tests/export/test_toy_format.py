"""An export format added from inside a test, touching no other file: a check, a file of its own, a
default chat template, what the model card says, and a row of forge.export.formats.FORMATS. `forge
export --format toy` then offers it, lists it in its help, refuses what its check refuses, writes its
file into the Hugging Face layout (listed and hashed in the manifest, so --overwrite knows it), and
`forge deploy` refuses it as it refuses every format without an import-job request."""
from __future__ import annotations

import hashlib
import json

import pytest

from export_fixtures import save_tiny
from forge import cli
from forge.export.formats import FORMATS, ExportFormat
from forge_testing import refusal

TOY_CONTEXT = 256
TOY_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"


def toy_problems(planned):
    """The toy runtime serves short contexts only, and never a weight over 1 MB."""
    out = []
    context = planned.config.get("max_position_embeddings")
    if context is not None and context > TOY_CONTEXT:
        out.append(f"max_position_embeddings is {context}; the toy runtime serves up to {TOY_CONTEXT}")
    out += [f"{name} is {size} bytes; the toy runtime loads weights under 1 MB"
            for name, size in planned.sizes.items() if size >= 2**20]
    return out


def toy_files(planned):
    return {"toy.json": json.dumps({"model": planned.name, "dtype": planned.dtype, "weights": len(planned.sizes),
                                    "weight_bytes": planned.weight_bytes,
                                    "architecture": planned.config["architectures"][0]}, indent=2) + "\n"}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(FORMATS, "toy", ExportFormat(
        "toy", "the toy runtime's layout, with its manifest toy.json", "toy runtime",
        checks=f"{__name__}:toy_problems", own_files=f"{__name__}:toy_files", template=f"{__name__}:TOY_TEMPLATE",
        use=("- toy: `toy-serve FOLDER`",)))


@pytest.fixture
def model(tiny_checkpoint, tmp_path):
    return save_tiny("llama", tmp_path / "llama", tiny_checkpoint)  # no chat template of its own


def test_a_toy_format_writes_its_files_into_the_layout(toy, model, tmp_path, capsys):
    out = tmp_path / "toy"
    assert cli.main(["export", str(model), "--out", str(out), "--format", "toy", "--model-name", "tiny-toy"]) == 0
    assert "(toy, bf16, " in capsys.readouterr().out
    manifest = json.loads((out / "forge-manifest.json").read_text())
    assert manifest["format"] == "toy" and manifest["chat_template"] == "default"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert json.loads((out / "toy.json").read_text()) == {
        "model": "tiny-toy", "dtype": "bf16", "weights": len(index["weight_map"]),
        "weight_bytes": index["metadata"]["total_size"], "architecture": "LlamaForCausalLM"}
    assert manifest["files"]["toy.json"]["sha256"] == hashlib.sha256((out / "toy.json").read_bytes()).hexdigest()
    assert {"config.json", "tokenizer.json", "generation_config.json", "MODEL_CARD.md"} <= set(manifest["files"])
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == TOY_TEMPLATE
    card = (out / "MODEL_CARD.md").read_text()
    assert "exported by forge in the toy runtime layout" in " ".join(card.split())
    assert "- toy: `toy-serve FOLDER`" in card and "forge deploy" not in card
    # the manifest lists toy.json, so an earlier toy export is one forge may replace
    assert cli.main(["export", str(model), "--out", str(out), "--format", "toy", "--overwrite"]) == 0


def test_the_toy_formats_check_refuses_before_writing(toy, tiny_checkpoint, tmp_path, capsys):
    long = save_tiny("llama", tmp_path / "long", tiny_checkpoint, max_position_embeddings=512)
    capsys.readouterr()
    assert cli.main(["export", str(long), "--out", str(tmp_path / "e"), "--format", "toy"]) == 2
    err = refusal(capsys.readouterr().err)
    assert err.startswith("forge: error: cannot export: max_position_embeddings is 512; the toy runtime serves "
                          f"up to {TOY_CONTEXT}") and err.count("\n") == 1
    assert not (tmp_path / "e").exists()
    # the same model is one the hf format (no checks of its own) writes
    assert cli.main(["export", str(long), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0


def test_the_help_lists_the_toy_format_and_deploy_refuses_it(toy, model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "{bedrock,hf,toy}" in shown and "toy: the toy runtime's layout, with its manifest toy.json" in shown
    role = ["--role-arn", "arn:aws:iam::123456789012:role/Import", "--s3-uri", "s3://forge-models/toy"]
    assert cli.main(["export", str(model), "--out", str(tmp_path / "e"), "--format", "toy", *role]) == 2
    assert "which does not take --format toy: use --format bedrock" in capsys.readouterr().err
    assert cli.main(["export", str(model), "--out", str(tmp_path / "e"), "--format", "toy"]) == 0
    capsys.readouterr()
    assert cli.main(["deploy", str(tmp_path / "e"), *role, "--dry-run"]) == 2
    assert "exported with --format toy; deploy needs --format bedrock" in capsys.readouterr().err
