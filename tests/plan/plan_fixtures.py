"""Tiny Hugging Face configs of every architecture the planner supports, and public configs of
published models (values copied from each model's config.json on the Hugging Face Hub)."""
from __future__ import annotations

import transformers

VOCAB = 128


def _llama_family(cls, gqa: bool, **extra):
    return cls(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2 if gqa else 4, vocab_size=VOCAB, max_position_embeddings=256, **extra)


def tiny_config(arch: str, gqa: bool = True):
    """A 2-layer, hidden-64 config of `arch`."""
    if arch == "llama":
        return _llama_family(transformers.LlamaConfig, gqa)
    if arch == "llama-bias-tied":
        return _llama_family(transformers.LlamaConfig, gqa, attention_bias=True, mlp_bias=True,
                             tie_word_embeddings=True)
    if arch == "mistral":
        return _llama_family(transformers.MistralConfig, gqa, sliding_window=16)
    if arch == "mixtral":
        return _llama_family(transformers.MixtralConfig, gqa, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen2":
        return _llama_family(transformers.Qwen2Config, gqa)
    if arch == "qwen3":
        return _llama_family(transformers.Qwen3Config, gqa, head_dim=24)
    if arch == "olmo2":
        return _llama_family(transformers.Olmo2Config, gqa)
    if arch == "smollm3":
        return _llama_family(transformers.SmolLM3Config, gqa, no_rope_layer_interval=2, pad_token_id=0)
    if arch == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=256,
                                       bos_token_id=0, eos_token_id=0)
    if arch == "gpt_bigcode":
        return transformers.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=256,
                                             multi_query=gqa, bos_token_id=0, eos_token_id=0)
    raise KeyError(arch)


ARCHS = ["llama", "llama-bias-tied", "mistral", "mixtral", "qwen2", "qwen3", "olmo2", "smollm3", "gpt2", "gpt_bigcode"]


def tiny_model(arch: str, gqa: bool = True):
    """Random-init model built from the tiny config, with eager attention (and eager experts) so
    FlopCounterMode sees every matmul."""
    cfg = tiny_config(arch, gqa)
    kwargs = {"attn_implementation": "eager"}
    if arch == "mixtral":
        kwargs["experts_implementation"] = "eager"
    return transformers.AutoModelForCausalLM.from_config(cfg, **kwargs), cfg.to_dict()


# Public config.json values (only the fields that decide the parameter count).
LLAMA_31_8B = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
LLAMA_31_70B = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                    num_attention_heads=64, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
MISTRAL_7B_V01 = dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, sliding_window=4096,
                      tie_word_embeddings=False)
QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
MIXTRAL_8X7B = dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, num_local_experts=8,
                    num_experts_per_tok=2, tie_word_embeddings=False)
