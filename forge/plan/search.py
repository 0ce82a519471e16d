"""Layout and chip-count search: which (tp, pp, dp, ZeRO, recompute, micro-batch) fits and is
fastest at a chip count; the fewest chips that fit; the chip count that meets a deadline/budget.

Tensor parallel stays inside the scale-up domain and divides the head count (Megatron-LM);
pipeline stages are powers of two or divisors of the layer count; data parallel takes the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from forge.plan.flops import (
    decode_flops_per_token,
    forward_flops_per_token,
    layer_forward_flops_per_token,
    recompute_flops_per_token,
    training_flops_per_token,
)
from forge.plan.hardware import System
from forge.plan.memory import STATE_BYTES, Memory, act_bytes_for, memory_per_chip, params_per_chip
from forge.plan.model import ModelSpec, ParamCount, count_parameters
from forge.plan.parallel import ADAM_BYTES_PER_PARAM, Layout, Rates, Shard, StepTime, Work, step_time
from forge.plan.stacks import Stack, get_stack
from forge.plan.workloads import Workload

GIB = 2**30
MAX_TP = 64
MAX_MICRO_BATCH = 64


@dataclass(frozen=True)
class Context:
    spec: ModelSpec
    pc: ParamCount
    workload: Workload
    system: System
    precision: str
    mfu: float            # the chip's matmul efficiency used (achieved GEMM FLOP/s / peak)
    sustained: float      # achieved GEMM FLOP/s per chip
    flash: bool
    overhead_s: float = 0.0  # calibrated fixed cost per step (local target)
    stack: Stack | None = None
    attn_rate: float = 0.0   # flash-attention FLOP/s per chip
    wide_rate: float = 0.0   # 16-bit GEMM FLOP/s: what the non-matmul work is measured against

    @classmethod
    def build(cls, spec, workload, system, mfu=None, flash=True, stack: str | None = None) -> Context:
        precision = workload.precision
        chip = system.chip
        st = get_stack(stack or system.default_stack)
        sustained = chip.sustained_flops(precision, mfu)
        effective = sustained / chip.peak_flops(precision)
        calibrated = mfu is None and precision in (chip.calibration or {}).get("effective_tflops", {})
        overhead = float((chip.calibration.get("step_overhead_s") or {}).get(precision, 0.0)) if calibrated else 0.0
        # low-precision recipes (Transformer Engine FP8, MXFP8) keep attention in BF16
        attn_prec = "bf16" if precision in ("fp8", "mxfp8", "fp4") and "bf16" in chip.peak_tflops else precision
        bf16_rate = sustained if attn_prec == precision else chip.sustained_flops(attn_prec, mfu)
        attn_rate = bf16_rate * (1.0 if calibrated else st.attention_efficiency)
        return cls(spec, count_parameters(spec), workload, system, precision, effective, sustained, flash,
                   overhead, st, attn_rate, bf16_rate)


@dataclass(frozen=True)
class Evaluated:
    layout: Layout
    memory: Memory
    step: StepTime
    seconds_per_seq: float


def hw_flops_per_seq(ctx: Context, recompute: str) -> float:
    s, wl = ctx.spec, ctx.workload
    # with flash attention, selective recomputation repeats elementwise ops only (no matmul FLOPs)
    rc = "none" if recompute == "selective" and ctx.flash else recompute
    per_tok = training_flops_per_token(s, wl.seq_len) + recompute_flops_per_token(s, wl.seq_len, rc)
    per_tok += wl.frozen_forwards * forward_flops_per_token(s, wl.seq_len)
    return per_tok * wl.seq_len


def attn_flops_per_seq(ctx: Context, recompute: str) -> float:
    """The attention-core (score and context) part of hw_flops_per_seq: 3 passes, 4 with full
    recomputation, plus the frozen forwards."""
    s, wl = ctx.spec, ctx.workload
    core = s.layers * layer_forward_flops_per_token(s, wl.seq_len)["attn_core"]
    passes = 3 + (1 if recompute == "full" or (recompute == "selective" and not ctx.flash) else 0)
    return core * (passes + wl.frozen_forwards) * wl.seq_len


def kv_flops_per_seq(ctx: Context, recompute: str) -> float:
    """The K and V projection part of hw_flops_per_seq (forward 2 x 2*h*kv_dim a token a block; the
    passes of training, full recomputation and the frozen forwards)."""
    s, wl = ctx.spec, ctx.workload
    passes = 3 + (1 if recompute == "full" else 0) + wl.frozen_forwards
    return s.layers * 4 * s.hidden * s.kv_dim * passes * wl.seq_len


def elementwise_bytes_per_seq(ctx: Context, recompute: str) -> float:
    """HBM bytes one pass of a block's elementwise kernels moves over a sequence, all blocks and the
    loss: forward reads and writes 2 RMSNorms (4h), 2 residual adds (6h), RoPE on q and k
    (2(q + kv)), the MLP activation (3f gated, 2f GELU; per routed expert); backward about twice
    that; the loss reads the logits and writes their gradient (3V). Recomputation repeats the
    forward (a third), as do the frozen forwards."""
    s, wl = ctx.spec, ctx.workload
    mlp = (3 if s.gated_mlp else 2) * s.ffn * (s.top_k if s.is_moe else 1)
    forward = 10 * s.hidden + 2 * (s.q_dim + s.kv_dim) + mlp
    passes = 3 + (1 if recompute != "none" else 0) + wl.frozen_forwards
    return (s.layers * forward * passes + 3 * s.vocab) * wl.seq_len * act_bytes_for(ctx.precision)


def optimizer_seconds(ctx: Context, layout: Layout) -> float:
    """The Adam update, memory bound: ADAM_BYTES_PER_PARAM per parameter this chip updates (its
    tp*pp shard, divided over dp*cp with ZeRO). Part of the calibrated rate on the local target."""
    if ctx.stack is not None and ctx.stack.key == "local":
        return 0.0
    shard = params_per_chip(ctx.pc, ctx.spec.layers, layout.tp, layout.pp)
    if layout.zero >= 1:
        shard /= layout.dp * layout.cp
    bw = ctx.system.chip.hbm_tbps * 1e12 * ctx.system.memory_bandwidth_efficiency
    return shard * ADAM_BYTES_PER_PARAM / bw


def tp_options(ctx: Context, n: int) -> list[int]:
    cap = min(ctx.system.scale_up_chips, MAX_TP, n)
    return [t for t in (2**i for i in range(7)) if t <= cap and n % t == 0 and ctx.spec.heads % t == 0]


def cp_options(ctx: Context, n_over_tp: int) -> list[int]:
    """Context parallel degrees: powers of two for long sequences (>= 16K), when the stack has it;
    each rank's chunk splits in two for causal load balancing (Megatron-Core: seq % 2cp == 0)."""
    seq = ctx.workload.seq_len
    if ctx.stack is None or not ctx.stack.context_parallel or seq < 16384:
        return [1]
    return [c for c in (2**i for i in range(6)) if n_over_tp % c == 0 and seq % (2 * c) == 0]


def pp_options(ctx: Context, n_over_tp: int) -> list[int]:
    layers = ctx.spec.layers
    cands = {p for p in range(1, min(layers, 64) + 1) if layers % p == 0 or (p & (p - 1)) == 0}
    return sorted(p for p in cands if n_over_tp % p == 0)


def vp_options(ctx: Context, p: int) -> list[int]:
    """1, 2 and 4 virtual stages per chip (at least one block each), if the stack interleaves.
    Uneven splits are allowed: Llama 3 405B ran 126 blocks on 16 stages (its paper, Sec. 3.3.2)."""
    if p == 1 or ctx.stack is None or not ctx.stack.interleaved_pp:
        return [1]
    return [v for v in (1, 2, 4) if p * v <= ctx.spec.layers]


def zero_options(ctx: Context, d: int) -> tuple[int, ...]:
    if d == 1:
        return (0,)
    return ctx.stack.zero if ctx.stack is not None else (0, 1, 2, 3)


def layouts(ctx: Context, n: int, lean: bool = False, fixed: dict | None = None):
    """Every candidate layout on n chips; lean=True yields only the least-memory variant of each
    (tp, cp, pp): the deepest ZeRO the stack has, full recomputation, micro-batch 1. `fixed` pins
    dimensions (tp, cp, pp, vp, dp, zero, recompute, micro_batch) as a published run states them."""
    fixed = fixed or {}
    batch = ctx.workload.global_batch

    def pick(key, options):
        return [fixed[key]] if key in fixed else list(options)

    recomputes = pick("recompute", ("none", "selective", "full"))
    for t in pick("tp", tp_options(ctx, n)):
        if n % t:
            continue
        for c in pick("cp", cp_options(ctx, n // t)):
            if (n // t) % c:
                continue
            for p in pick("pp", pp_options(ctx, n // (t * c))):
                if (n // (t * c)) % p:
                    continue
                d = n // (t * c * p)
                if d > batch or ("dp" in fixed and fixed["dp"] != d):
                    continue
                zeros = pick("zero", zero_options(ctx, d))
                for v in pick("vp", vp_options(ctx, p)):
                    if lean:
                        yield Layout(t, p, d, max(zeros), recomputes[-1] if "recompute" in fixed else "full",
                                     fixed.get("micro_batch", 1),
                                     math.ceil(batch / (d * fixed.get("micro_batch", 1))), cp=c, vp=v)
                        continue
                    for zero in zeros:
                        for rc in recomputes:
                            bs = pick("micro_batch", (2**i for i in range(7)))
                            for b in bs:
                                if b > max(1, min(MAX_MICRO_BATCH, math.ceil(batch / d))):
                                    break
                                yield Layout(t, p, d, zero, rc, b, math.ceil(batch / (d * b)), cp=c, vp=v)


def evaluate(ctx: Context, layout: Layout) -> Evaluated | None:
    """Memory and step time of a layout; None if it does not fit."""
    mem = memory_per_chip(ctx.spec, ctx.pc, layout, ctx.workload.seq_len, ctx.precision, ctx.flash,
                          ctx.workload.frozen_copies)
    if mem.total > ctx.system.usable_bytes:
        return None
    params = params_per_chip(ctx.pc, ctx.spec.layers, layout.tp, layout.pp)
    w, g, _ = STATE_BYTES[ctx.precision]
    kw = {} if ctx.stack is None else {"stack": ctx.stack}
    work = Work(ctx.workload.seq_len, hw_flops_per_seq(ctx, layout.recompute),
                attn_flops_per_seq(ctx, layout.recompute), act_bytes_for(ctx.precision),
                kv_flops_per_seq(ctx, layout.recompute), elementwise_bytes_per_seq(ctx, layout.recompute))
    shard = Shard(params * w, params * g, optimizer_seconds(ctx, layout))
    rates = Rates(ctx.sustained, ctx.attn_rate, ctx.wide_rate, ctx.overhead_s)
    st = step_time(ctx.spec, ctx.system, layout, work, shard, rates, **kw)
    # the global batch is a hyper-parameter: fixed; slots beyond it (dp*mb*m > batch) sit idle
    return Evaluated(layout, mem, st, st.total / ctx.workload.global_batch)


def best_layout(ctx: Context, n: int, fixed: dict | None = None) -> Evaluated | None:
    """The fastest layout (time per sequence) that fits on n chips; ties go to less memory."""
    best = None
    for layout in layouts(ctx, n, fixed=fixed):
        ev = evaluate(ctx, layout)
        if ev is None:
            continue
        if best is None or (ev.seconds_per_seq, ev.memory.total) < (best.seconds_per_seq * (1 - 1e-9),
                                                                        best.memory.total):
            best = ev
    return best


def leanest(ctx: Context, n: int) -> tuple[Layout, Memory] | None:
    best = None
    for layout in layouts(ctx, n, lean=True):
        mem = memory_per_chip(ctx.spec, ctx.pc, layout, ctx.workload.seq_len, ctx.precision, ctx.flash,
                              ctx.workload.frozen_copies)
        if best is None or mem.total < best[1].total:
            best = (layout, mem)
    return best


def fits(ctx: Context, n: int) -> bool:
    lean = leanest(ctx, n)
    return lean is not None and lean[1].total <= ctx.system.usable_bytes and (
        not ctx.workload.generation or generation_seconds(ctx, n) < math.inf)


def chip_counts(system: System, start: int = 1, stop: int | None = None) -> list[int]:
    """Chip counts one can rent: powers of two inside an instance, whole instances inside the
    scale-up domain, then whole domains."""
    stop = min(stop or system.max_chips, system.max_chips)
    cpi, dom = max(1, system.chips_per_instance), max(1, system.scale_up_chips)
    out = {2**i for i in range(20) if 2**i < cpi}
    out |= set(range(cpi, dom + 1, cpi))
    k = 1
    while k * dom <= stop:
        out.add(k * dom)
        k = k + 1 if k < 16 else int(k * 1.25)
    return sorted(c for c in out if start <= c <= stop)


def min_chips_to_fit(ctx: Context) -> int | None:
    for n in chip_counts(ctx.system):
        if fits(ctx, n):
            return n
    return None


def chips_for_goal(ctx: Context, min_fit: int | None, deadline_h: float | None,
                   budget_usd: float | None) -> tuple[int, str]:
    """(chips, "") for the goal, or (chips, reason) when no chip count meets it:
    deadline only: the fewest chips that finish in time; budget only: the fastest plan within it;
    both: the cheapest plan that finishes in time, refused if even that exceeds the budget.
    Chip counts are tried on a geometric ladder; when a rung meets the deadline the counts skipped
    below it are tried too, and with a budget the ladder goes on while plans get cheaper."""
    if min_fit is None:
        return ctx.system.default_chips, explain_no_fit(ctx, ctx.system.default_chips, None)
    counts = chip_counts(ctx.system, start=min_fit)
    tried: list[tuple[int, float, float]] = []

    def attempt(n: int):
        ev = best_layout(ctx, n)
        if ev is None:
            return None
        hours = stage_seconds(ctx, ev, n) / 3600
        tried.append((n, hours, hours * n * ctx.system.usd_per_chip_hour))
        return ev, tried[-1]

    def in_time(row) -> bool:
        return deadline_h is not None and row[1] <= deadline_h

    last, hit, dearer = -1, False, 0
    for i, n in enumerate(counts):
        if last >= 0 and n < counts[last] * 1.15:
            continue                                   # thin the list to a geometric ladder
        got = attempt(n)
        if got and in_time(got[1]):
            if not hit:
                for m in counts[last + 1:i]:           # the fewest chips: try the skipped rungs
                    attempt(m)
                hit = True
            if budget_usd is None:
                break
            cheapest = min(x[2] for x in tried if in_time(x))
            dearer = dearer + 1 if got[1][2] > cheapest else 0
            if dearer >= 3:
                break                                  # past the cheapest: more chips only cost more
        last = i
        if got and got[0].layout.dp >= ctx.workload.global_batch:
            break                                      # more chips cannot add data parallelism
    if not tried:
        return min_fit, explain_no_fit(ctx, min_fit, min_fit)
    if deadline_h is None:
        within = [x for x in tried if x[2] <= budget_usd]
        if within:
            return min(within, key=lambda x: x[1])[0], ""
        n, hours, cost = min(tried, key=lambda x: x[2])
        return n, (f"budget ${budget_usd:,.0f} cannot be met on {ctx.system.name}: the cheapest plan found "
                   f"costs ${cost:,.0f} ({n} chips, {hours:,.1f} h)")
    on_time = [x for x in tried if in_time(x)]
    if on_time and budget_usd is None:
        return min(on_time)[0], ""
    if on_time:
        n, hours, cost = min(on_time, key=lambda x: (x[2], x[0]))
        if cost <= budget_usd:
            return n, ""
        return n, (f"deadline {deadline_h:g} h and budget ${budget_usd:,.0f} cannot both be met on "
                   f"{ctx.system.name}: the cheapest plan that meets the deadline costs ${cost:,.0f} "
                   f"({n} chips, {hours:,.1f} h)")
    n, hours, cost = min(tried, key=lambda x: x[1])
    return n, (f"deadline {deadline_h:g} h cannot be met on {ctx.system.name}: the fastest plan "
               f"found takes {hours:,.1f} h on {n} chips (${cost:,.0f}); the global batch of "
               f"{ctx.workload.global_batch} sequences limits data parallelism")


def stage_seconds(ctx: Context, ev: Evaluated, n: int) -> float:
    """Wall-clock seconds of the whole stage: training steps, rollouts, cached pre-pass."""
    wl = ctx.workload
    seconds = wl.steps * ev.step.total
    if wl.generation:
        seconds += wl.steps * generation_seconds(ctx, n)
    if wl.pre_pass_sequences:
        seconds += wl.pre_pass_sequences * wl.seq_len * forward_flops_per_token(ctx.spec, wl.seq_len) / (
            n * ctx.sustained)
    return seconds


def explain_no_fit(ctx: Context, n: int, min_fit: int | None) -> str:
    """Why nothing fits on n chips, from the leanest layout's memory."""
    sys, wl = ctx.system, ctx.workload
    usable = sys.usable_bytes / GIB
    lean = leanest(ctx, n)
    head = (f"{wl.kind} stage {wl.name!r} ({ctx.spec.name}, seq {wl.seq_len}) does not fit on {n} x "
            f"{sys.chip.name}")
    if lean is None:
        return (f"{head}: no tensor/pipeline/data split of {n} chips works for {ctx.spec.heads} heads, "
                f"{ctx.spec.layers} layers and a global batch of {wl.global_batch}")
    layout, mem = lean
    states = (mem.weights + mem.grads + mem.optimizer + mem.frozen) / GIB
    acts = mem.activations / GIB
    msg = (f"{head}: even the leanest layout ({layout.describe()}) needs {mem.total / GIB:,.1f} GiB per chip "
           f"(model states {states:,.1f} GiB, activations {acts:,.1f} GiB) and a chip has {usable:,.1f} GiB "
           f"usable ({sys.usable_memory_fraction:.0%} of {sys.chip.hbm_bytes / GIB:,.1f} GiB).")
    max_tp = max(tp_options(ctx, 2**16), default=1)
    if acts > usable and min_fit is None:
        msg += (f" Activations alone exceed HBM at sequence length {wl.seq_len} even at tensor parallel "
                f"{max_tp} (the most the scale-up domain and {ctx.spec.heads} heads allow) with full "
                f"recomputation; more chips do not help. Shorten the sequence, use context parallelism "
                f"(not modelled) or a chip with more memory.")
    elif min_fit is not None and min_fit > n:
        msg += f" It fits from {min_fit} chips."
    elif min_fit is None:
        msg += f" It does not fit on up to {sys.max_chips} chip(s)."
    return msg


def generation_seconds(ctx: Context, n: int) -> float:
    """Seconds of RL rollout generation per step on n chips: decode is memory-bandwidth bound,
    each new token reads the weights and the KV cache once (Pope et al. 2022, "Efficiently
    Scaling Transformer Inference", Sec. 2). Replicas of tp_g chips split the sequences; waves
    run when the KV cache of all sequences does not fit. inf if a replica cannot hold the model."""
    s, gen, sys = ctx.spec, ctx.workload.generation, ctx.system
    weights = ctx.pc.total * 2.0                                   # bf16 weights for serving
    kv_per_token = 2 * s.layers * s.kv_dim * 2.0                    # K and V, bf16
    seq = gen.prompt_len + gen.gen_len
    bw = sys.chip.hbm_tbps * 1e12 * sys.memory_bandwidth_efficiency
    for tp in tp_options(ctx, n):
        budget = sys.usable_bytes * tp - weights
        concurrent_cap = int(budget // (kv_per_token * seq)) if budget > 0 else 0
        if concurrent_cap < 1:
            continue
        replicas = n // tp
        per_replica = math.ceil(gen.sequences / replicas)
        batch = min(per_replica, concurrent_cap)
        waves = math.ceil(per_replica / batch)
        prefill = batch * gen.prompt_len * forward_flops_per_token(s, gen.prompt_len) / (tp * ctx.sustained)
        ctx_mean = gen.prompt_len + gen.gen_len / 2
        read = (weights + batch * kv_per_token * ctx_mean) / tp / bw
        compute = batch * decode_flops_per_token(s, int(ctx_mean)) / (tp * ctx.sustained)
        return waves * (prefill + gen.gen_len * max(read, compute))
    return math.inf


def stage_model_flops(ctx: Context) -> float:
    """All model FLOPs of the stage: training, frozen forwards, cached pre-pass, generation."""
    s, wl = ctx.spec, ctx.workload
    total = wl.tokens_processed * training_flops_per_token(s, wl.seq_len)
    total += wl.tokens_processed * wl.frozen_forwards * forward_flops_per_token(s, wl.seq_len)
    total += wl.pre_pass_sequences * wl.seq_len * forward_flops_per_token(s, wl.seq_len)
    if wl.generation:
        g = wl.generation
        per_seq = g.prompt_len * forward_flops_per_token(s, g.prompt_len) + g.gen_len * decode_flops_per_token(
            s, g.prompt_len + g.gen_len // 2)
        total += wl.steps * g.sequences * per_seq
    return total
