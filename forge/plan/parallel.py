"""Parallel layouts and the time of one training step under them.

Step time = matmul time at the chip's achieved GEMM rate + the stack's non-matmul time + the part
of each collective the stack does not overlap (alpha-beta ring model) + pipeline bubble + the
optimizer update. Rank order follows Megatron-LM: tensor parallel innermost (inside the fast
scale-up domain), then context parallel, then data parallel, then pipeline stages outermost.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from forge.plan.hardware import System
from forge.plan.model import ModelSpec
from forge.plan.stacks import Stack

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout:
    """How a stage is spread over chips: tp * pp * dp chips; micro_batch sequences per micro-step,
    `microbatches` micro-steps per optimizer step on each data-parallel rank."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0              # 0 = DDP, 1/2 = ZeRO-1/2, 3 = ZeRO-3 / FSDP full shard
    recompute: str = "none"    # none | selective | full
    micro_batch: int = 1
    microbatches: int = 1
    sp: bool = True            # sequence parallel alongside tensor parallel (Korthikanti 2022)
    cp: int = 1                # context parallel: each sequence split over cp chips (ring attention)
    vp: int = 1                # virtual pipeline stages per chip (interleaved 1F1B)

    @property
    def chips(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.microbatches

    def describe(self) -> str:
        zero = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[self.zero]
        rc = {"none": "", "selective": " sel-rc", "full": " full-rc"}[self.recompute]
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        vp = f" vp{self.vp}" if self.vp > 1 else ""
        return f"tp{self.tp}{cp} pp{self.pp}{vp} dp{self.dp} {zero} mb{self.micro_batch}x{self.microbatches}{rc}"

    def as_dict(self) -> dict:
        return asdict(self)


# ---- alpha-beta collectives (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009) -------
# n bytes is the full buffer; p ranks; alpha = per-hop latency (s); beta = per-direction bytes/s.

def ring_allreduce_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """Ring all-reduce: 2(p-1) steps, each moving n/p bytes: 2(p-1)alpha + 2(p-1)/p * n/beta."""
    if p <= 1 or n_bytes <= 0:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / beta


def ring_allgather_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """Ring all-gather (or reduce-scatter) of an n-byte result: (p-1)alpha + (p-1)/p * n/beta."""
    if p <= 1 or n_bytes <= 0:
        return 0.0
    return (p - 1) * alpha + (p - 1) / p * n_bytes / beta


ring_reduce_scatter_time = ring_allgather_time


def group_allgather_time(n_bytes: float, g: int, stride: int, system: System) -> float:
    """All-gather (or reduce-scatter) of an n-byte result over the g data-parallel ranks, `stride`
    chips apart (the tensor-parallel ranks sit between them). Inside one scale-up domain: a ring on
    its fabric. Past it, hierarchically: the k members a domain holds split the buffer, each moves
    its n/k slice over its own share of the network with its counterparts in the other domains,
    then the domain gathers over its fabric (hierarchical all-reduce, Jia et al. 2018,
    arXiv:1807.11205; NCCL runs one ring per NIC, so a node's members cross it side by side). With
    one member per domain (tensor parallel filling it) this is the flat ring."""
    if g <= 1 or n_bytes <= 0:
        return 0.0
    span = g * stride
    if span <= system.scale_up_chips:
        return ring_allgather_time(n_bytes, g, system.hop_latency(span), system.ring_bandwidth(span))
    k = max(1, min(g, system.scale_up_chips // max(1, stride)))
    inter = ring_allgather_time(n_bytes / k, math.ceil(g / k), system.hop_latency(span), system.ring_bandwidth(span))
    local = k * stride
    return inter + ring_allgather_time(n_bytes, k, system.hop_latency(local), system.ring_bandwidth(local))


def p2p_time(n_bytes: float, alpha: float, beta: float) -> float:
    return alpha + n_bytes / beta if n_bytes > 0 else 0.0


def pipeline_bubble_fraction(pp: int, microbatches: int, vp: int = 1) -> float:
    """1F1B bubble as a share of the step: (p-1)/v over m + (p-1)/v micro-slots (Narayanan et al.
    2021, Sec. 2.2.1-2.2.2: bubble (p-1)*t, divided by v virtual stages with the interleaved schedule)."""
    bubble = (pp - 1) / vp
    return bubble / (microbatches + bubble)


# What a stack without overheads or overlap does (the bare model, and the calibrated local target)
BARE = Stack("bare", "no stack", 0.0, 1.0, 0.0, 1.0, 0.0, True, True, (0, 1, 2, 3))

# Adam update traffic per parameter it updates: read fp32 master, m, v (12 B) and the gradient
# (2-4 B), write master, m, v (12 B) and the 16-bit weight (2 B): 28 B, memory-bound.
ADAM_BYTES_PER_PARAM = 28


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step and its parts; `total` is what the plan uses."""

    compute: float        # m micro-batches of matmuls (+ recompute) and the stack's non-matmul ops
    tp_comm: float        # exposed tensor/sequence-parallel all-gathers and reduce-scatters
    pp_bubble: float      # (p-1)/v idle micro-slots
    pp_comm: float        # stage-to-stage activation sends
    dp_comm: float        # exposed gradient / parameter collectives after overlap
    total: float
    overhead: float = 0.0  # fixed per-step cost (calibrated on the local machine)
    cp_comm: float = 0.0   # exposed context-parallel KV ring
    optimizer: float = 0.0  # the optimizer update (memory bound, after the last backward)


@dataclass(frozen=True)
class Work:
    """One sequence of a step: seq_len tokens, hw_flops hardware FLOPs to process it (training,
    recompute, frozen forwards), of which attn_flops are flash-attention score/context matmuls;
    activations of act_bytes per element."""

    seq_len: int
    hw_flops: float
    attn_flops: float = 0.0
    act_bytes: int = 2
    kv_flops: float = 0.0      # of hw_flops: the K and V projections (replicated when TP ranks > KV heads)
    elementwise_bytes: float = 0.0  # HBM traffic of one pass of the elementwise kernels (norms, residuals,
                                    # RoPE, MLP activation, loss) over the sequence, all blocks


@dataclass(frozen=True)
class Shard:
    """The tp*pp shard of the model on one chip: bytes of its weights and gradients before ZeRO, and
    the seconds its optimizer update takes."""

    param_bytes: float
    grad_bytes: float
    optimizer_s: float = 0.0


@dataclass(frozen=True)
class Rates:
    """What the chip achieves: gemm FLOP/s on matmuls, attn FLOP/s on flash attention (None: gemm),
    wide its 16-bit GEMM rate (None: gemm); overhead_s a fixed cost per step (calibrated locally)."""

    gemm: float
    attn: float | None = None
    wide: float | None = None
    overhead_s: float = 0.0


def step_time(
    spec: ModelSpec, system: System, layout: Layout, work: Work, shard: Shard, rates: Rates, stack: Stack = BARE,
) -> StepTime:
    """Time of one optimizer step under `layout`: `work` per sequence, `shard` the weights and
    gradients the data-parallel collectives move and the update's time, `rates` what the chip
    achieves. The stack's non-matmul time is memory bound: its elementwise passes over the
    activations at the chip's HBM bandwidth (so it does not speed up with FP8 matmuls, and its
    share of the step falls as the hidden size grows: bytes grow with h, matmul FLOPs with h^2).
    """
    t, p, d, m, b = layout.tp, layout.pp, layout.dp, layout.microbatches, layout.micro_batch
    c, v = layout.cp, max(1, layout.vp)
    split = t * c * p                      # one micro-batch's work is split over tp*cp*pp chips
    attn_rate = rates.attn or rates.gemm
    # more tensor-parallel ranks than KV heads: each rank computes a whole KV head, so the K and V
    # projections run ranks/kv_heads times (NxD GQAQKVColumnParallelLinear, kv_size_multiplier)
    ranks = t * system.chip.cores if t > 1 else 1
    kv_extra = work.kv_flops * (ranks / spec.kv_heads - 1) if ranks > spec.kv_heads else 0.0
    gemm_s = (work.hw_flops - work.attn_flops + kv_extra) * b / split / rates.gemm
    attn_s = work.attn_flops * b / split / attn_rate
    # the stack's elementwise kernels read and write the activations `elementwise_passes` times
    # (1: fused forward and backward kernels; eager PyTorch runs every op as its own kernel)
    hbm = system.chip.hbm_tbps * 1e12 * system.memory_bandwidth_efficiency
    elementwise_s = stack.elementwise_passes * work.elementwise_bytes * b / split / hbm
    tau_compute = gemm_s + attn_s + elementwise_s
    blocks = math.ceil(spec.layers / p)
    tau_tp = 0.0
    if t > 1:
        # Megatron-LM with sequence parallel: per block 2 all-gathers + 2 reduce-scatters of the
        # s*b*h activation forward, as many backward (Korthikanti et al. 2022, Sec. 4.2.2);
        # full recomputation repeats the forward ones. The stack hides tp_overlap of it. The ring
        # has a member per rank (each NeuronCore of a Trainium is one): a hop's latency per rank.
        per_layer = 8 + (4 if layout.recompute == "full" else 0)
        n = work.seq_len / c * b * spec.hidden * work.act_bytes
        coll = ring_allgather_time(n, ranks, system.hop_latency(t), system.ring_bandwidth(t))
        tau_tp = blocks * per_layer * coll * (1 - stack.tp_overlap)
    tau_cp = 0.0
    if c > 1:
        # ring attention (Liu et al. 2023; Megatron-Core context parallel): per block the K,V chunk
        # of s/c tokens travels c-1 hops forward, K,V and their gradients backward (3x); each hop
        # overlaps with the attention of the chunk in hand, so cp_overlap of that compute hides it
        chunk = 2 * work.seq_len / c * b * spec.kv_dim / t * work.act_bytes
        span = t * c
        hop = p2p_time(chunk, system.hop_latency(span), system.ring_bandwidth(span))
        ring = blocks * 3 * (c - 1) * hop
        tau_cp = max(0.0, ring - stack.cp_overlap * attn_s)
    tau = tau_compute + tau_tp + tau_cp
    compute, tp_comm, cp_comm = m * tau_compute, m * tau_tp, m * tau_cp
    bubble = (p - 1) / v * tau
    pp_comm = 0.0
    if p > 1:
        # activations (scattered over tp with sequence parallel) cross each stage boundary forward
        # and backward; only the fill and drain sends are on the critical path of 1F1B, and the
        # interleaved schedule passes p*v chunk boundaries instead of p.
        n = work.seq_len / c * b * spec.hidden * work.act_bytes / t
        span = layout.chips
        pp_comm = 2 * (p * v - 1) * p2p_time(n, system.hop_latency(span), system.ring_bandwidth(span))
    dp_comm = 0.0
    g = d * c                              # gradients are reduced over data and context ranks
    if g > 1:
        # tp innermost, then cp, then dp: the data-parallel ranks are t chips apart
        def gather(n: float) -> float:
            return group_allgather_time(n, g, t, system)

        window = stack.dp_overlap * tau_compute
        if layout.zero == 3:
            # FSDP / ZeRO-3: all-gather weights for forward and again for backward, reduce-scatter
            # gradients, every micro-batch; prefetch overlaps them with that micro-batch's compute.
            per_mb = 2 * gather(shard.param_bytes) + gather(shard.grad_bytes)
            dp_comm = m * max(0.0, per_mb - window)
        elif layout.zero in (1, 2):
            # ZeRO-1/2 (distributed optimizer): gradient reduce-scatter under the last backward (2/3
            # of a micro-batch), updated-parameter all-gather under the next forward (1/3)
            rs, ag = gather(shard.grad_bytes), gather(shard.param_bytes)
            dp_comm = max(0.0, rs - 2 / 3 * window) + max(0.0, ag - 1 / 3 * window)
        else:
            # DDP: one all-reduce (reduce-scatter + all-gather), bucketed under the backward of the
            # last micro-batch (2/3 of it)
            dp_comm = max(0.0, 2 * gather(shard.grad_bytes) - 2 / 3 * window)
    total = compute + tp_comm + cp_comm + bubble + pp_comm + dp_comm + shard.optimizer_s + rates.overhead_s
    return StepTime(compute, tp_comm, bubble, pp_comm, dp_comm, total, rates.overhead_s, cp_comm, shard.optimizer_s)
