"""forge export checks config.json against the tensors in the shards before writing anything
(layer count, hidden size, vocabulary, heads, MLP width, experts), and --verify refuses to load a
model whose config declares more parameters than the files hold. Weights that are not safetensors
(a pickle named model.safetensors) are named as such by export and eval; a full disk while writing
the shards is one line and leaves nothing behind."""
from __future__ import annotations

import errno
import io
import json
import pickle
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

from export_fixtures import save_tiny
from forge import cli
from forge_testing import refusal
from test_export_paths import snapshot


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = cli.main(list(argv))
    return code, err.getvalue()


def _one_line_refusal(code: int, err: str, *says: str) -> None:
    assert code == 2, err
    err = refusal(err)  # after the command's first line
    assert err.startswith("forge: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "unexpected error" not in err and "--resume" not in err, err
    for text in says:
        assert text in err, err


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


# the tiny models: 2 layers, hidden 32, 4 heads of 8, 2 kv heads, intermediate 64; llama's config
# gives head_dim, qwen2's does not (hidden_size / num_attention_heads)
@pytest.mark.parametrize("kind, key, value, says", [("llama", *case) for case in [
    ("num_hidden_layers", 1e12, "the weights say 2"),
    ("num_hidden_layers", 10**12, "the weights say 2"),
    ("num_hidden_layers", -5, "the weights say 2"),
    ("num_hidden_layers", "two", "the weights say 2"),
    ("num_hidden_layers", 3, "the weights say 2"),
    ("hidden_size", 0, "the weights say 32"),
    ("hidden_size", 64, "the weights say 32"),
    ("vocab_size", None, "the weights say"),
    ("vocab_size", 50000, "the weights say"),
    ("num_attention_heads", 3, "the weights say 4"),
    ("num_attention_heads", 8, "the weights say 4"),
    ("num_key_value_heads", 3, "the weights say 2"),
    ("head_dim", 4, "the weights say 8"),
    ("intermediate_size", 10**12, "the weights say 64"),
]] + [("qwen2", "num_attention_heads", 3, "hidden_size 32"),
      ("qwen2", "num_attention_heads", 8, "the weights say num_attention_heads 4 or num_key_value_heads 4"),
      ("qwen2", "num_key_value_heads", 4, "the weights say num_attention_heads 8 or num_key_value_heads 2"),
      ("qwen2", "num_attention_heads", 0, "expected a positive")])
def test_config_is_checked_against_the_tensors(kind, key, value, says, tiny_checkpoint, tmp_path):
    src = save_tiny(kind, tmp_path / "m", tiny_checkpoint)
    _edit_config(src, **{key: value})
    before = snapshot(tmp_path)
    code, err = _cli("export", str(src), "--out", str(tmp_path / "e"), "--verify")
    _one_line_refusal(code, err, "config.json: ", f"{key} is {json.dumps(value)}", says)
    assert snapshot(tmp_path) == before and not (tmp_path / "e").exists()


def test_mixtral_expert_count_is_checked(tiny_checkpoint, tmp_path):
    src = save_tiny("mixtral", tmp_path / "m", tiny_checkpoint)
    _edit_config(src, num_local_experts=10**9)
    code, err = _cli("export", str(src), "--out", str(tmp_path / "e"))
    _one_line_refusal(code, err, "num_local_experts", "the weights say 4")


def test_verify_refuses_a_config_declaring_more_than_the_files_hold(tiny_checkpoint, tmp_path):
    src = save_tiny("llama", tmp_path / "m", tiny_checkpoint, tie_word_embeddings=True)  # no lm_head in the files
    _edit_config(src, tie_word_embeddings=False)  # now the config declares one
    code, err = _cli("export", str(src), "--out", str(tmp_path / "e"), "--verify")
    _one_line_refusal(code, err, "declares", "parameters", "the safetensors files hold")
    assert not (tmp_path / "e").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_pickle_named_safetensors_is_named_by_export_and_eval(tiny_checkpoint, tmp_path):
    src = save_tiny("llama", tmp_path / "m", tiny_checkpoint)
    state = {"w": torch.zeros(2)}
    with open(src / "model.safetensors", "wb") as f:
        pickle.dump(state, f)
    code, err = _cli("export", str(src), "--out", str(tmp_path / "e"))
    _one_line_refusal(code, err, "model.safetensors", "not a safetensors file")
    torch.save(state, src / "model.safetensors")
    code, err = _cli("export", str(src), "--out", str(tmp_path / "e"))
    _one_line_refusal(code, err, "model.safetensors", "not a safetensors file")
    from forge_testing import write_recipe

    suite = write_recipe(tmp_path / "suite.yaml", {
        "data": {"general": {"generate": {"kind": "stories", "documents": 20}}},
        "eval": {"perplexity": ["general"], "domain": [], "general": [], "seq_len": 32, "max_blocks": 2}})
    code, err = _cli("eval", "--models", str(src), "--suite", str(suite))
    last = err.splitlines()[-1] + "\n"  # after eval's progress lines
    _one_line_refusal(code, last, "model.safetensors", "not a safetensors file")
    assert "Traceback" not in err and "unexpected error" not in err


@pytest.mark.parametrize("failure", ["oserror", "safetensors"])
def test_a_full_disk_while_writing_the_shards_is_one_line(failure, tiny_checkpoint, tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    src = save_tiny("llama", tmp_path / "m", tiny_checkpoint)
    out = tmp_path / "e"
    assert _cli("export", str(src), "--out", str(out))[0] == 0
    before = snapshot(tmp_path)

    def full(*args, **kwargs):
        if failure == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    code, err = _cli("export", str(src), "--out", str(out), "--overwrite")
    _one_line_refusal(code, err, "No space left on device", str(out))
    assert snapshot(tmp_path) == before  # the earlier export intact, nothing beside it
