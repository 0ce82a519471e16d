"""Parallel layouts and the time of one training step under them.

Step time = compute at an assumed MFU + exposed communication (alpha-beta ring model) + pipeline
bubble. Rank order follows Megatron-LM: tensor parallel innermost (inside the fast scale-up
domain), then data parallel, then pipeline stages outermost.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from forge.plan.hardware import System
from forge.plan.model import ModelSpec

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

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.microbatches

    def describe(self) -> str:
        zero = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[self.zero]
        rc = {"none": "", "selective": " sel-rc", "full": " full-rc"}[self.recompute]
        return f"tp{self.tp} pp{self.pp} dp{self.dp} {zero} mb{self.micro_batch}x{self.microbatches}{rc}"

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


def p2p_time(n_bytes: float, alpha: float, beta: float) -> float:
    return alpha + n_bytes / beta if n_bytes > 0 else 0.0


def pipeline_bubble_fraction(pp: int, microbatches: int) -> float:
    """1F1B / GPipe bubble as a share of the step: (p-1)/(m+p-1) (Narayanan et al. 2021, Sec. 2.2:
    bubble time (p-1)*t over ideal m*t)."""
    return (pp - 1) / (microbatches + pp - 1)


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step and its parts; `total` is what the plan uses."""

    compute: float        # m micro-batches of forward+backward (+ recompute) at sustained FLOP/s
    tp_comm: float        # exposed tensor/sequence-parallel all-gathers and reduce-scatters
    pp_bubble: float      # (p-1) idle micro-slots
    pp_comm: float        # stage-to-stage activation sends
    dp_comm: float        # exposed gradient / parameter collectives after overlap
    total: float
    overhead: float = 0.0  # fixed per-step cost (calibrated on the local machine)


def step_time(
    spec: ModelSpec, system: System, layout: Layout, seq_len: int, hw_flops_per_seq: float,
    sustained_flops: float, param_bytes_per_chip: float, grad_bytes_per_chip: float, act_bytes: int = 2,
    overhead_s: float = 0.0,
) -> StepTime:
    """Time of one optimizer step.

    hw_flops_per_seq: hardware FLOPs to process one sequence (training, recompute, frozen forwards).
    param_bytes_per_chip / grad_bytes_per_chip: the tp*pp shard of weights and gradients, before ZeRO.
    """
    t, p, d, m, b = layout.tp, layout.pp, layout.dp, layout.microbatches, layout.micro_batch
    # one micro-batch through one pipeline stage on one chip
    tau_compute = hw_flops_per_seq * b / (t * p) / sustained_flops
    tau_tp = 0.0
    if t > 1:
        # Megatron-LM with sequence parallel: per block 2 all-gathers + 2 reduce-scatters of the
        # s*b*h activation forward, as many backward (Korthikanti et al. 2022, Sec. 4.2.2);
        # full recomputation repeats the forward ones.
        per_layer = 8 + (4 if layout.recompute == "full" else 0)
        n = seq_len * b * spec.hidden * act_bytes
        coll = ring_allgather_time(n, t, system.hop_latency(t), system.ring_bandwidth(t))
        tau_tp = math.ceil(spec.layers / p) * per_layer * coll
    tau = tau_compute + tau_tp
    compute, tp_comm = m * tau_compute, m * tau_tp
    bubble = (p - 1) * tau
    pp_comm = 0.0
    if p > 1:
        # activations (scattered over tp with sequence parallel) cross each stage boundary forward
        # and backward; only the fill and drain sends are on the critical path of 1F1B.
        n = seq_len * b * spec.hidden * act_bytes / t
        span = layout.chips
        pp_comm = 2 * (p - 1) * p2p_time(n, system.hop_latency(span), system.ring_bandwidth(span))
    dp_comm = 0.0
    if d > 1:
        span = t * d                       # tp innermost, then dp
        alpha, beta = system.hop_latency(span), system.ring_bandwidth(span)
        if layout.zero == 3:
            # FSDP / ZeRO-3: all-gather weights for forward and again for backward, reduce-scatter
            # gradients, every micro-batch; prefetch overlaps them with that micro-batch's compute.
            per_mb = 2 * ring_allgather_time(param_bytes_per_chip, d, alpha, beta) + ring_reduce_scatter_time(
                grad_bytes_per_chip, d, alpha, beta)
            dp_comm = m * max(0.0, per_mb - tau_compute)
        else:
            # DDP / ZeRO-1/2: one all-reduce-volume gradient exchange per step (ZeRO-1/2 split it
            # into reduce-scatter + all-gather, same volume; Rajbhandari et al. 2020, Sec. 7),
            # overlapped with the backward of the last micro-batch (2/3 of its compute).
            dp_comm = max(0.0, ring_allreduce_time(grad_bytes_per_chip, d, alpha, beta) - 2 / 3 * tau_compute)
    total = compute + tp_comm + bubble + pp_comm + dp_comm + overhead_s
    return StepTime(compute, tp_comm, bubble, pp_comm, dp_comm, total, overhead_s)
