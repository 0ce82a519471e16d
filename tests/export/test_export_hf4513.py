"""Exports really load under transformers 4.51.3, Bedrock's runtime: a throwaway virtualenv gets
transformers==4.51.3 from PyPI, loads each export (config, tokenizer, model) and must reproduce what
forge's transformers 5 computes from the same files. Slow (about a minute to build the venv)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from export_fixtures import save_tiny
from forge.export.compat import known_keys
from forge.export.layout import ExportOptions, export
from forge.export.source import resolve
from forge_testing import SHARED

HERE = Path(__file__).parent
PROMPTS = ["Once upon a time", "The valve is rated for 40 bar."]
EXPECTED = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mixtral": "MixtralForCausalLM", "scratch": "LlamaForCausalLM", "stories260K": "LlamaForCausalLM"}


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
    from hf4513_venv import build

    try:
        return build(tmp_path_factory.mktemp("venv") / "hf4513")
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        pytest.skip(f"cannot build a transformers 4.51.3 virtualenv (PyPI unreachable?): {str(e)[:300]}")


def _v5_view(folder: Path) -> dict:
    """What transformers 5 computes from the export: token ids, logits, chat rendering."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = [tok(p).input_ids for p in PROMPTS]
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([i])).logits[0] for i in ids]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True)
    return {"ids": ids, "logits": logits, "chat": chat}


@pytest.mark.slow
def test_exports_load_under_transformers_4_51_3(venv_python, tiny_checkpoint, tmp_path):
    sources = {kind: save_tiny(kind, tmp_path / "src" / kind, tiny_checkpoint) for kind in
               ("llama", "mistral", "qwen2", "mixtral")}
    sources["scratch"] = tiny_checkpoint  # what `forge run` builds for the quickstart
    if (SHARED / "models" / "stories260K").is_dir():
        sources["stories260K"] = SHARED / "models" / "stories260K"  # config written by transformers 5
    exports = {}
    for kind, src in sources.items():
        exports[kind] = tmp_path / "out" / kind
        export(resolve(str(src), None, tmp_path / "work"), exports[kind], ExportOptions(), log=lambda *_: None)
    run = subprocess.run([str(venv_python), str(HERE / "hf4513_check.py"), json.dumps(PROMPTS),
                          *map(str, exports.values())], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for kind, folder in exports.items():
        old, new = got[str(folder)], _v5_view(folder)
        assert old["model_class"] == EXPECTED[kind], kind
        assert old["torch_dtype"] == "torch.bfloat16"
        assert old["ids"] == new["ids"], f"{kind}: 4.51.3 tokenizes differently"
        assert old["chat"] == new["chat"], kind
        for a, b in zip(old["logits"], new["logits"]):  # same bf16 weights, both run in fp32
            torch.testing.assert_close(torch.tensor(a), b, rtol=1e-4, atol=1e-5, msg=kind)
        src_config = json.loads((sources[kind] / "config.json").read_text())
        rope = src_config.get("rope_parameters") or {}
        assert old["rope_theta"] == rope.get("rope_theta", src_config.get("rope_theta")), kind
        if kind == "llama":
            assert old["rope_scaling"]["rope_type"] == "llama3" and old["rope_scaling"]["factor"] == 8.0
        # the key lists forge keeps as data match the real 4.51.3 configuration classes
        model_type = src_config["model_type"]
        assert set(old["init_params"]) <= set(known_keys()["models"][model_type]), kind
