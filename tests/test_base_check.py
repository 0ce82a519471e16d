"""`forge validate` checks a base checkpoint folder cheaply: weights readable, tokenizer present."""
from __future__ import annotations

import shutil

import pytest

from forge_testing import base_recipe, write_recipe
from forge import cli
from forge.base_check import check_base


@pytest.fixture
def base(tiny_checkpoint, tmp_path):
    folder = tmp_path / "base"
    shutil.copytree(tiny_checkpoint, folder)
    return folder


def _validate(tmp_path, base, capsys) -> tuple[int, str]:
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, base=str(base)))
    code = cli.main(["validate", str(path)])
    return code, capsys.readouterr().err


def test_good_base_validates(tmp_path, base, capsys):
    assert check_base(base) == []
    assert _validate(tmp_path, base, capsys)[0] == 0


def test_empty_weights_file_is_reported(tmp_path, base, capsys):
    (base / "model.safetensors").write_bytes(b"")
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "model.safetensors" in err and "empty" in err and "line 2" in err, err


def test_truncated_weights_file_is_reported(tmp_path, base, capsys):
    weights = base / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "model.safetensors" in err and "truncated" in err and str(len(data) - 1000) in err, err


def test_garbage_header_is_reported(tmp_path, base, capsys):
    (base / "model.safetensors").write_bytes((50).to_bytes(8, "little") + b"{not json" + b" " * 100)
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "model.safetensors" in err and "header" in err, err


def test_missing_tokenizer_is_named_as_such(tmp_path, base, capsys):
    for p in base.iterdir():
        if p.name.startswith(("tokenizer", "special_tokens")):
            p.unlink()
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "no tokenizer files" in err and "install" not in err, err


def test_pickle_weights_only_are_refused(tmp_path, base, capsys):
    (base / "model.safetensors").unlink()
    (base / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "safetensors" in err and "pytorch_model.bin" in err, err


def test_sharded_index_naming_a_missing_shard(tmp_path, base, capsys):
    (base / "model.safetensors").rename(base / "model-00001-of-00002.safetensors")
    (base / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}')
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "model-00002-of-00002.safetensors" in err and "missing" in err, err


def test_bad_config_json_is_reported(tmp_path, base, capsys):
    (base / "config.json").write_text("{oops")
    code, err = _validate(tmp_path, base, capsys)
    assert code == 2 and "config.json" in err and "JSON" in err, err
