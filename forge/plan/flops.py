"""Training and inference FLOPs of a decoder-only transformer, from its ModelSpec.

Only matrix multiplies are counted (2 FLOPs per multiply-add); norms, activations, softmax and
the loss are not, which is also what torch.utils.flop_counter.FlopCounterMode counts.

Attention modes:
  "causal" (default for plans): a query at position i scores i keys, so the score and context
           matmuls do half the dense work (s/2 keys on average) as in Megatron-LM's
           `num_floating_point_operations` ("only half of the attention matrix is non-zero").
           A sliding window w < s caps the span: mean keys = w - w^2/(2s).
  "dense":  every query scores all s keys. This is what an eager (masked) attention kernel
           executes and what FlopCounterMode counts; tests compare in this mode.

Training = 3 x forward (forward, backward data-gradient, backward weight-gradient; Narayanan et
al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", Appendix). Activation
recomputation adds hardware FLOPs, not model FLOPs (Korthikanti et al. 2022, Sec. 5).
"""
from __future__ import annotations

from dataclasses import dataclass

from forge.plan.model import ModelSpec, count_parameters

ATTENTION_MODES = ("causal", "dense")


def attention_span(seq_len: int, window: int = 0, mode: str = "causal") -> float:
    """Mean number of keys a query multiplies against."""
    if mode not in ATTENTION_MODES:
        raise ValueError(f"attention mode {mode!r} not in {ATTENTION_MODES}")
    if mode == "dense":
        return float(seq_len)
    w = min(window, seq_len) if window and window > 0 else seq_len
    return w - w * w / (2.0 * seq_len)


def layer_forward_flops_per_token(s: ModelSpec, seq_len: int, mode: str = "causal") -> dict:
    """Forward FLOPs of one block for one token, by part."""
    proj = 2 * (s.hidden * s.q_dim + 2 * s.hidden * s.kv_dim + s.q_dim * s.hidden)   # q, k, v, o
    # scores Q K^T and context P V: 2 * (2 * q_dim * span). GQA does not change it: each query
    # head still multiplies head_dim-wide keys (HF repeat_kv; Megatron's formula agrees).
    core = 4 * s.q_dim * attention_span(seq_len, s.sliding_window, mode)
    mats = 3 if s.gated_mlp else 2
    experts = s.top_k if s.is_moe else 1
    mlp = 2 * mats * s.hidden * s.ffn * experts
    router = 2 * s.hidden * s.experts if s.is_moe else 0
    return {"attn_proj": proj, "attn_core": core, "mlp": mlp, "router": router}


def forward_flops_per_token(s: ModelSpec, seq_len: int, mode: str = "causal") -> float:
    """Forward FLOPs per token: all blocks plus the logit layer (2*h*V)."""
    layer = sum(layer_forward_flops_per_token(s, seq_len, mode).values())
    return s.layers * layer + 2 * s.hidden * s.vocab


def training_flops_per_token(s: ModelSpec, seq_len: int, mode: str = "causal") -> float:
    """Model FLOPs per trained token: 3 x forward (fwd + dgrad + wgrad)."""
    return 3.0 * forward_flops_per_token(s, seq_len, mode)


def recompute_flops_per_token(s: ModelSpec, seq_len: int, recompute: str, mode: str = "causal") -> float:
    """Extra hardware FLOPs per token that recomputation adds (Korthikanti et al. 2022, Sec. 5):
    full = one more forward of every block; selective = one more forward of the attention core."""
    if recompute == "full":
        return forward_flops_per_token(s, seq_len, mode) - 2 * s.hidden * s.vocab
    if recompute == "selective":
        return s.layers * layer_forward_flops_per_token(s, seq_len, mode)["attn_core"]
    return 0.0


@dataclass(frozen=True)
class MegatronArgs:
    """The fields of Megatron-LM's `args` that `num_floating_point_operations` reads, by their names."""

    seq_length: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    padded_vocab_size: int
    swiglu: bool = True
    moe_router_topk: int = 1


def megatron_num_floating_point_operations(args: MegatronArgs, batch_size: int) -> float:
    """Megatron-LM megatron/training/training.py `num_floating_point_operations(args, batch_size)`,
    transcribed (dense attention halved for causality; no router term). Used to check our general form."""
    seq_length, num_layers, hidden_size = args.seq_length, args.num_layers, args.hidden_size
    num_attention_heads, num_query_groups = args.num_attention_heads, args.num_query_groups
    query_projection_size = args.kv_channels * num_attention_heads
    ratio = query_projection_size / hidden_size
    gated = 3 / 2 if args.swiglu else 1
    expansion_factor = 3 * 2 * 2
    return (
        expansion_factor * batch_size * seq_length * num_layers * hidden_size * hidden_size
        * (
            (1 + num_query_groups / num_attention_heads + seq_length / hidden_size / 2) * ratio
            + (args.ffn_hidden_size / hidden_size) * args.moe_router_topk * gated
            + args.padded_vocab_size / (2 * num_layers * hidden_size)
        )
    )


def palm_flops_per_token(s: ModelSpec, seq_len: int) -> float:
    """PaLM (Chowdhery et al. 2022, Appendix B) model FLOPs for MFU: 6N + 12*L*H*Q*T, with N the
    (active) parameters that take part in matmuls, H heads, Q head dim, T sequence length."""
    n = count_parameters(s).matmul_active
    return 6.0 * n + 12.0 * s.layers * s.heads * s.head_dim * seq_len


def decode_flops_per_token(s: ModelSpec, context: int) -> float:
    """Forward FLOPs to generate one token with a KV cache holding `context` tokens."""
    span = min(context, s.sliding_window) if s.sliding_window else context
    per_layer = layer_forward_flops_per_token(s, 1, "dense")
    return s.layers * (per_layer["attn_proj"] + per_layer["mlp"] + per_layer["router"] + 4 * s.q_dim * span) + (
        2 * s.hidden * s.vocab
    )
