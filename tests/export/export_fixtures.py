"""Tiny Hugging Face checkpoints of the architectures export handles, built offline in tmp folders."""
from __future__ import annotations

from pathlib import Path

import torch

ARCHS = {
    # llama with Llama 3.1-style RoPE: the config translation has real work to do
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
}
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tiny(kind: str, out: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """A 2-layer, hidden-32 model of `kind` (or 'gpt2') with the tokenizer from `tokenizer_dir`."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, vocab_size=len(tok),
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model = transformers.GPT2LMHeadModel(config)
    else:
        cfg_cls, model_cls, extra = ARCHS[kind]
        kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=128,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        kw.update(extra)
        kw.update(overrides)
        model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw))
    if kind == "qwen2":
        tok.chat_template = QWEN_TEMPLATE
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return Path(out)
