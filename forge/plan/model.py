"""Model shapes from a Hugging Face config.json, and exact parameter counts from them.

Everything here works from the config alone (no weights), so Llama-3.1-70B can be planned on a
laptop. Supported: llama, mistral, mixtral (MoE), qwen2, qwen3, olmo2, smollm3, gpt2, gpt_bigcode. Parameter
counts equal `model.num_parameters()` of the transformers implementation (tied weights counted
once); tests/plan checks this for tiny instances and for published model sizes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from forge.errors import ForgeError

PRESETS_FILE = Path(__file__).with_name("models.yaml")
LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "olmo2", "smollm3")
GPT_LIKE = ("gpt2", "gpt_bigcode")
SUPPORTED = LLAMA_LIKE + GPT_LIKE

FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: the same data, faster


@dataclass(frozen=True)
class ModelSpec:
    """The shapes that decide parameters, FLOPs and memory of a decoder-only transformer."""

    arch: str
    hidden: int                 # h
    layers: int                 # L
    heads: int                  # a (query heads)
    kv_heads: int               # query groups (GQA); == heads for MHA, 1 for MQA
    head_dim: int               # d_head; q width = heads*head_dim (may differ from h, e.g. Qwen3)
    ffn: int                    # intermediate size (per expert for MoE)
    vocab: int                  # V
    gated_mlp: bool             # SwiGLU (3 matrices) vs GELU MLP (2 matrices)
    tied_embeddings: bool
    experts: int = 0            # routed experts (0 = dense)
    top_k: int = 0              # experts per token
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    layernorm_bias: bool = False  # LayerNorm (weight+bias) vs RMSNorm (weight)
    qk_norm: bool = False       # Qwen3 per-head RMSNorm on q and k
    positions: int = 0          # learned absolute position embeddings (GPT-2), else 0 (RoPE)
    sliding_window: int = 0     # attention window (Mistral v0.1), 0 = full
    dropout: bool = False       # dropout layers active (GPT-2 defaults); changes activation memory
    name: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


def _get(cfg: dict, *keys, default=None):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def spec_from_config(cfg: dict, name: str = "") -> ModelSpec:
    """Read a Hugging Face config dict (config.json contents) into a ModelSpec."""
    arch = cfg.get("model_type")
    if arch not in SUPPORTED:
        raise ForgeError(
            f"the planner does not know model_type {arch!r}; supported: {', '.join(SUPPORTED)}"
        )
    name = name or cfg.get("_name_or_path") or arch
    if arch in GPT_LIKE:
        h = int(_get(cfg, "n_embd", "hidden_size"))
        heads = int(_get(cfg, "n_head", "num_attention_heads"))
        mqa = arch == "gpt_bigcode" and bool(cfg.get("multi_query", True))
        dropout = any(float(cfg.get(k, 0.0) or 0.0) > 0 for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
        return ModelSpec(
            arch=arch, hidden=h, layers=int(_get(cfg, "n_layer", "num_hidden_layers")), heads=heads,
            kv_heads=1 if mqa else heads, head_dim=h // heads,
            ffn=int(_get(cfg, "n_inner", default=4 * h)), vocab=int(cfg["vocab_size"]), gated_mlp=False,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)), qkv_bias=True, o_bias=True,
            mlp_bias=True, layernorm_bias=True, positions=int(_get(cfg, "n_positions", "max_position_embeddings")),
            dropout=dropout, name=name,
        )
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(_get(cfg, "head_dim", default=h // heads))
    if arch == "qwen2":
        qkv_bias, o_bias = True, False          # Qwen2Attention: bias on q/k/v only
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    window = 0
    if arch == "mistral" or arch == "mixtral" or cfg.get("use_sliding_window"):
        window = int(cfg.get("sliding_window") or 0)
    experts = int(cfg.get("num_local_experts", 0) or 0) if arch == "mixtral" else 0
    return ModelSpec(
        arch=arch, hidden=h, layers=int(cfg["num_hidden_layers"]), heads=heads,
        kv_heads=int(_get(cfg, "num_key_value_heads", default=heads)), head_dim=head_dim,
        ffn=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]), gated_mlp=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), experts=experts,
        top_k=int(cfg.get("num_experts_per_tok", 0) or 0) if experts else 0,
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=arch in ("qwen3", "olmo2"), sliding_window=window, name=name,
    )


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts. `total` is what num_parameters() reports; `active` is per token (MoE)."""

    total: int
    active: int
    embedding: int        # input token (+ position) embeddings: looked up, not multiplied
    lm_head: int          # untied output projection (0 when tied)
    per_layer: int        # one transformer block, all experts
    per_layer_active: int  # one transformer block, top_k experts + router
    final_norm: int
    embedding_tokens: int = 0  # the V*h token part of `embedding`

    @property
    def matmul_active(self) -> int:
        """Active parameters that take part in matmuls per token: blocks plus the logit layer."""
        logit = self.lm_head if self.lm_head else self.embedding_tokens
        return self.active - self.embedding - self.lm_head - self.final_norm + logit


def attention_params(s: ModelSpec) -> int:
    """q, k, v, o projections (+ biases, + Qwen3/OLMo 2 q/k norms). [HF modeling_llama/qwen2/qwen3/olmo2/gpt2]"""
    n = s.hidden * s.q_dim + 2 * s.hidden * s.kv_dim + s.q_dim * s.hidden
    if s.qkv_bias:
        n += s.q_dim + 2 * s.kv_dim
    if s.o_bias:
        n += s.hidden
    if s.qk_norm:  # Qwen3 norms each head (head_dim weights); OLMo 2 the whole q and k projections
        n += s.q_dim + s.kv_dim if s.arch == "olmo2" else 2 * s.head_dim
    return n


def mlp_params(s: ModelSpec) -> int:
    """One dense MLP: SwiGLU gate/up/down = 3*h*f, or GELU fc/proj = 2*h*f (+ biases)."""
    mats = 3 if s.gated_mlp else 2
    n = mats * s.hidden * s.ffn
    if s.mlp_bias:
        n += (mats - 1) * s.ffn + s.hidden
    return n


def norm_params(s: ModelSpec) -> int:
    return 2 * s.hidden if s.layernorm_bias else s.hidden


def count_parameters(s: ModelSpec) -> ParamCount:
    """Exact parameter count (tied embeddings once; MoE total and active)."""
    router = s.hidden * s.experts if s.is_moe else 0   # MixtralTopKRouter: Linear(h, E, bias=False)
    mlp_total = s.experts * mlp_params(s) + router if s.is_moe else mlp_params(s)
    mlp_active = s.top_k * mlp_params(s) + router if s.is_moe else mlp_params(s)
    block_fixed = attention_params(s) + 2 * norm_params(s)
    per_layer, per_layer_active = block_fixed + mlp_total, block_fixed + mlp_active
    tokens = s.vocab * s.hidden
    embedding = tokens + s.positions * s.hidden
    lm_head = 0 if s.tied_embeddings else s.vocab * s.hidden
    final = norm_params(s)
    fixed = embedding + lm_head + final
    return ParamCount(
        total=fixed + s.layers * per_layer, active=fixed + s.layers * per_layer_active,
        embedding=embedding, lm_head=lm_head, per_layer=per_layer, per_layer_active=per_layer_active,
        final_norm=final, embedding_tokens=tokens,
    )


def load_presets() -> dict:
    return yaml.load(PRESETS_FILE.read_text(), Loader=FAST) or {}


def load_model_config(ref: str | Path | dict) -> dict:
    """A config dict from: a dict, a config.json path, a checkpoint dir, or a preset name."""
    if isinstance(ref, dict):
        return ref
    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ForgeError(f"{path} is not valid JSON: {exc}") from exc
    presets = load_presets()
    key = str(ref).lower()
    if key in presets:
        return dict(presets[key])
    raise ForgeError(
        f"no model config at {ref!r} (expected a config.json, a checkpoint directory, or a preset: "
        f"{', '.join(sorted(presets))})"
    )
