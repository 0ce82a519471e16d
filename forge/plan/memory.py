"""Memory per chip: model states (weights, gradients, Adam) and activations, under a Layout.

Model states follow ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", Sec. 5): mixed-precision Adam keeps 2 bytes of 16-bit weights,
2 bytes of 16-bit gradients and K = 12 bytes of fp32 master weights, momentum and variance per
parameter (16 bytes in all); ZeRO-1 shards the optimizer states over data parallel ranks,
ZeRO-2 also the gradients, ZeRO-3 (= FSDP full shard) also the weights. Tensor parallel divides
every block by tp; pipeline parallel gives each stage ceil(L/pp) blocks (the first stage also
holds the embedding, the last the output layer).

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Sec. 4: per block s*b*h*(34 + 5*a*s/h) bytes for GPT with 16-bit
activations, /tp with tensor + sequence parallel; selective recomputation drops the 5as/h score
term; full recomputation keeps only the 2sbh block input. Generalised here to GQA, SwiGLU, any
MLP width, no dropout and flash attention (no s x s score matrix is stored). With flash attention,
selective recomputation means keeping matmul outputs and recomputing the elementwise ops (norms,
SwiGLU activation and product), as torchtitan's per-op SAC and Megatron-Core's recompute_modules
do. Context parallelism divides the sequence (and so every activation) over cp ranks; the
interleaved 1F1B schedule keeps (1 + (p-1)/(p*v)) times the 1F1B activations on the first stage
(Narayanan et al. 2021, Sec. 2.2.2; Megatron-LM theoretical_memory_usage.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from forge.plan.model import ModelSpec, ParamCount
from forge.plan.parallel import Layout

# bytes per parameter: (weights, gradients, optimizer states incl. fp32 master copy)
STATE_BYTES = {
    "bf16": (2, 2, 12),       # mixed precision Adam, ZeRO paper's 16 bytes/param
    "fp16": (2, 2, 12),
    "fp8": (2, 2, 12),        # fp8 matmuls, bf16 weights and fp32 master as in mixed precision
    "mxfp8": (2, 2, 12),
    "fp4": (2, 2, 12),
    "fp32": (4, 4, 8),        # fp32 weights and grads, Adam m and v
    "bf16-pure": (2, 2, 4),   # everything in bf16, no master copy
}


def act_bytes_for(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def model_state_bytes(params: float, precision: str = "bf16", zero: int = 0, dp: int = 1) -> dict:
    """Bytes of weights, gradients and optimizer states on one chip holding `params` parameters
    (its tp*pp shard), with ZeRO stage `zero` over `dp` data-parallel ranks."""
    w, g, o = STATE_BYTES[precision]
    weights = params * w / (dp if zero >= 3 else 1)
    grads = params * g / (dp if zero >= 2 else 1)
    optim = params * o / (dp if zero >= 1 else 1)
    return {"weights": weights, "grads": grads, "optimizer": optim, "total": weights + grads + optim}


def params_per_chip(pc: ParamCount, layers: int, tp: int = 1, pp: int = 1) -> float:
    """Parameters on the fullest pipeline stage, divided over tp ranks."""
    if pp <= 1:
        return pc.total / tp
    blocks = math.ceil(layers / pp) * pc.per_layer
    # tied embeddings: the last stage keeps its own copy of the matrix for the logits (Megatron)
    head = pc.lm_head if pc.lm_head else pc.embedding_tokens
    first = pc.embedding + blocks
    last = blocks + pc.final_norm + head
    return max(first, last) / tp


def layer_activation_bytes(
    s: ModelSpec, layout: Layout, seq_len: int, flash: bool = True, act_bytes: int = 2,
) -> float:
    """Activation bytes one block keeps for backward, for one micro-batch, on one tp rank.
    Reads the layout's micro_batch, tp, sp and recompute; seq_len is the tokens of a sequence on one
    rank (activation_bytes divides it by cp first)."""
    micro_batch, tp, sp, recompute = layout.micro_batch, layout.tp, layout.sp, layout.recompute
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    mask = 1 if s.dropout else 0              # dropout masks are 1 byte per element
    rep_div = tp if sp else 1                 # sequence parallel shards the "replicated" part too
    if recompute == "full":
        return seq_len * micro_batch * h * act_bytes / rep_div   # only the block input
    elementwise_rc = recompute == "selective" and flash   # keep matmul outputs, recompute the rest
    # norm inputs (2h), attention and MLP inputs (2h), dropout masks after attention and MLP (2h);
    # selective (flash) keeps the two residual inputs and recomputes the norms from them
    replicated = (2 if elementwise_rc else 4) * h * act_bytes + 2 * h * mask
    # Q, K, V; output-projection input; attention-output dropout is in `replicated`
    attn = (q + kv + kv + q) * act_bytes
    if s.qk_norm and not elementwise_rc:
        attn += (q + kv) * act_bytes          # pre-norm q and k (Qwen3)
    # SwiGLU: gate, up, act(gate), product (selective: gate and up only, the rest recomputed)
    inner = (2 if elementwise_rc or not s.gated_mlp else 4) * f * act_bytes
    if s.is_moe:
        inner = s.top_k * (inner + h * act_bytes)        # per routed expert, with its gathered input
    if flash or recompute == "selective":
        score = s.heads * 4 if flash else 0   # flash attention keeps fp32 log-sum-exp per head
    else:
        # softmax output, dropout mask, dropout output: a*s per token each (5as for 16-bit)
        score = s.heads * seq_len * (act_bytes + mask + (act_bytes if mask else 0))
    sharded = attn + inner + score
    return seq_len * micro_batch * (replicated / rep_div + sharded / tp)


def activation_bytes(
    s: ModelSpec, layout: Layout, seq_len: int, flash: bool = True, act_bytes: int = 2,
) -> float:
    """Activation bytes on the fullest chip. With 1F1B the first stage keeps min(m, p) micro-batches
    in flight (Narayanan et al. 2021; Korthikanti Sec. 4.2.3); the last stage also holds the
    logits (Korthikanti: 4sbv/tp for fp32 logits, plus their 16-bit copy)."""
    t, p, b, m = layout.tp, layout.pp, layout.micro_batch, layout.microbatches
    v = max(1, layout.vp)
    seq_len = math.ceil(seq_len / max(1, layout.cp))   # context parallel: s/cp tokens per rank
    rep_div = t if layout.sp else 1
    per_layer = layer_activation_bytes(s, layout, seq_len, flash, act_bytes)
    working = 0.0
    if layout.recompute in ("full", "selective"):   # one block is rematerialised at a time in backward
        working = layer_activation_bytes(s, replace(layout, recompute="none"), seq_len, flash, act_bytes)
    blocks = math.ceil(s.layers / p)
    embed_out = seq_len * b * s.hidden * act_bytes / rep_div
    logits = seq_len * b * s.vocab * (act_bytes + 4) / t
    in_flight = min(m, p) * (1 + (p - 1) / (p * v) if v > 1 and m >= p else 1)
    first = blocks * per_layer * in_flight + working + embed_out
    last = blocks * per_layer + working + logits
    return first + logits if p == 1 else max(first, last)


@dataclass(frozen=True)
class Memory:
    """Bytes per chip on the fullest chip."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float        # ZeRO-3 gathered layers, gradient buckets
    frozen: float         # frozen copies (DPO reference, RL reference / reward models)
    total: float


def memory_per_chip(
    s: ModelSpec, pc: ParamCount, layout: Layout, seq_len: int, precision: str = "bf16",
    flash: bool = True, frozen_copies: int = 0,
) -> Memory:
    """Peak memory on the fullest chip for training under `layout`."""
    shard = params_per_chip(pc, s.layers, layout.tp, layout.pp)
    # context-parallel ranks hold the same weights and reduce gradients with the data-parallel ones,
    # so ZeRO shards over both (Megatron-Core's distributed optimizer uses the dp x cp group;
    # torchtitan shards FSDP over dp_shard x cp)
    ranks = layout.dp * max(1, layout.cp)
    states = model_state_bytes(shard, precision, layout.zero, ranks)
    w, g, _ = STATE_BYTES[precision]
    buffers = 0.0
    if layout.zero >= 3 and ranks > 1:
        # two gathered blocks (current + prefetched) and one block of unsharded gradients
        buffers = pc.per_layer / layout.tp * (2 * w + g)
    frozen = frozen_copies * shard * w / (ranks if layout.zero >= 3 else 1)
    acts = activation_bytes(s, layout, seq_len, flash, act_bytes_for(precision))
    total = states["total"] + acts + buffers + frozen
    return Memory(states["weights"], states["grads"], states["optimizer"], acts, buffers, frozen, total)
