"""LoRA SFT: merged and unmerged checkpoints load with plain transformers / peft, agree with each
other, and generate; unknown target modules are refused with the modules the model has."""
from __future__ import annotations

import json

import pytest
import torch

from forge.errors import ForgeError
from forge_testing import run_stage
from test_sft import qa_source, sft

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"]}


def test_lora_merged_and_adapter_load_and_agree(tmp_path, tiny_checkpoint):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = {"qa": qa_source(tmp_path)}
    constant = {"kind": "constant"}
    merged = run_stage(sft(max_steps=4, lora=LORA, schedule=constant), tiny_checkpoint, src, tmp_path / "m").checkpoint
    adapter = run_stage(sft(max_steps=4, lora={**LORA, "merge": False}, schedule=constant), tiny_checkpoint, src,
                        tmp_path / "a").checkpoint
    assert not (merged / "adapter_config.json").exists() and (merged / "model.safetensors").is_file()
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(tiny_checkpoint.resolve()) and cfg["r"] == 4
    assert not (adapter / "model.safetensors").exists()

    tok = AutoTokenizer.from_pretrained(merged)
    assert tok.chat_template and AutoTokenizer.from_pretrained(adapter).chat_template == tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "What color is the sky?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    m = AutoModelForCausalLM.from_pretrained(merged).eval()
    p = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"]), adapter).eval()
    with torch.no_grad():
        lb, lm, lp = (x(**ids).logits for x in (base, m, p))
    assert (lm - lb).abs().max() > 1e-3           # the adapters trained
    torch.testing.assert_close(lm, lp, atol=1e-5, rtol=1e-5)  # merged == base + adapter
    for model in (m, p):
        out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
        assert out.shape[1] > ids["input_ids"].shape[1]


def test_unknown_target_module_is_refused_at_load(tmp_path, tiny_checkpoint):
    with pytest.raises(ForgeError, match=r"lora.target_modules \['c_attn'\] are not modules of LlamaForCausalLM"):
        run_stage(sft(max_steps=1, schedule={"kind": "constant"}, lora={"target_modules": ["c_attn"]}), tiny_checkpoint,
                  {"qa": qa_source(tmp_path)}, tmp_path / "x")
