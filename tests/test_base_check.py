"""`forge validate` checks a base checkpoint folder cheaply: weights readable, tokenizer present."""
from __future__ import annotations

import shutil

import pytest

from forge import cli
from forge.base_check import check_base
from forge_testing import base_recipe, write_recipe


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


def test_a_fifo_or_symlink_loop_among_the_files_is_named_never_waited_on(tmp_path):
    """A FIFO named config.json or model.safetensors would block a reader forever: check_base reads
    regular files only (run in a subprocess, so a hang fails the test instead of stalling it)."""
    import os
    import subprocess
    import sys

    from catalog_testing import write_header_only_checkpoint
    from forge_testing import REPO

    folder = write_header_only_checkpoint(tmp_path / "ckpt", weights=False)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    os.mkfifo(folder / "model.safetensors")
    (folder / "b.safetensors").symlink_to(folder / "a.safetensors")
    (folder / "a.safetensors").symlink_to(folder / "b.safetensors")
    code = f"import json; from forge.base_check import check_base; print(json.dumps(check_base({str(folder)!r})))"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    problems = " | ".join(__import__("json").loads(done.stdout))
    assert "config.json is not a regular file (a FIFO)" in problems, problems
    assert "model.safetensors is not a regular file (a FIFO)" in problems, problems
    assert "a.safetensors cannot be read" in problems and "b.safetensors cannot be read" in problems, problems


def test_the_not_safetensors_line_never_waits_on_a_fifo(tmp_path):
    """not_safetensors peeks at a file's first bytes to say what it looks like; a FIFO given the
    weights' name is said to be no regular file instead of blocking the peek (in a subprocess, so a
    hang fails the test instead of stalling it)."""
    import os
    import subprocess
    import sys

    from forge.errors import not_safetensors
    from forge_testing import REPO

    pickle = tmp_path / "pickle.safetensors"
    pickle.write_bytes(b"\x80\x02}q\x00.")
    assert "(it looks like a pickle)" in str(not_safetensors(pickle, ValueError("bad header")))
    os.mkfifo(tmp_path / "model.safetensors")
    code = ("from pathlib import Path; from forge.errors import not_safetensors; "
            f"print(not_safetensors(Path({str(tmp_path / 'model.safetensors')!r}), ValueError('bad header')))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "\n" not in line and line.startswith(f"{tmp_path / 'model.safetensors'}: not a safetensors file"), line
    assert "(it is not a regular file)" in line, line
