"""One stage planned on one target: the StagePlan record, and the search for the fewest chips that
fit, the fastest layout at that count and what the run costs (forge.plan.planner adds the error band)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from forge.plan import search
from forge.plan.flops import forward_flops_per_token, training_flops_per_token
from forge.plan.hardware import System, get_system, load_catalog
from forge.plan.model import ModelSpec, count_parameters, spec_from_config
from forge.plan.workloads import Workload

GIB = 2**30


@dataclass
class StagePlan:
    """One stage on one target. Plain data: json-able via as_dict()."""

    stage: str
    kind: str
    model: str
    params_total: int
    params_active: int
    target: str
    system: str
    chip: str
    chips: int
    precision: str
    feasible: bool
    reason: str = ""
    layout: str = ""
    layout_detail: dict = field(default_factory=dict)
    seq_len: int = 0
    global_batch: int = 0
    steps: int = 0
    tokens_trained: float = 0.0
    tokens_processed: float = 0.0
    flops_total: float = 0.0
    flops_per_token: float = 0.0
    step_time_s: float = 0.0
    step_breakdown_s: dict = field(default_factory=dict)
    generation_s_per_step: float = 0.0
    hours: float = 0.0
    chip_hours: float = 0.0
    cost_usd: float = 0.0
    energy_kwh: float = 0.0
    tokens_per_mwh: float = 0.0
    mfu_assumed: float = 0.0
    mfu_achieved: float = 0.0
    memory_gib: dict = field(default_factory=dict)
    usable_gib: float = 0.0
    min_chips_fit: int | None = None
    usd_per_chip_hour: float = 0.0
    price_kind: str = ""
    notes: list = field(default_factory=list)
    stack: str = ""
    error_band: float = 0.0     # relative +- on step time, hours and cost (from the anchors)
    band_basis: str = ""        # what the band rests on; says "projection" where no anchor does

    def as_dict(self) -> dict:
        return asdict(self)


def as_spec(model: dict | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else spec_from_config(model)


@dataclass(frozen=True)
class Goal:
    """How many chips to plan on: exactly `chips`; else the fewest that finish within deadline_h
    hours and/or budget_usd dollars; else (all None) the target's default size, raised to the
    fewest chips that fit."""

    chips: int | None = None
    deadline_h: float | None = None
    budget_usd: float | None = None


@dataclass(frozen=True)
class Setup:
    """How the stage runs: the training stack (stacks.yaml; None: the target's), layout dimensions
    to pin (tp, cp, pp, vp, dp, zero, recompute, micro_batch) as a published run states them, an
    override of the chip's matmul efficiency (mfu), and flash attention."""

    stack: str | None = None
    layout: dict | None = None
    mfu: float | None = None
    flash: bool = True


def plan_unbanded(
    model: dict | ModelSpec, workload: Workload, target: str = "local", goal: Goal = Goal(),
    setup: Setup = Setup(), catalog: dict | None = None,
) -> StagePlan:
    """Plan `workload` for `model` (config dict or ModelSpec) on `target`, at the chip count `goal`
    asks for, run as `setup` says, without an error band (forge.plan.planner.plan_stage attaches
    the band the anchors give; the anchors replay with this)."""
    spec = as_spec(model)
    system = get_system(target, catalog if catalog is not None else load_catalog())
    ctx = search.Context.build(spec, workload, system, setup.mfu, setup.flash, setup.stack)
    min_fit = search.min_chips_to_fit(ctx) if setup.layout is None else None
    notes = list(workload.notes) + _catalog_notes(system, ctx, spec)
    n, best, why = _choose_chips(ctx, goal, min_fit, notes, setup.layout)
    plan = _shell(spec, workload, system, ctx, n, min_fit, notes)
    if best is None:
        plan.feasible = False
        plan.reason = why or search.explain_no_fit(ctx, n, min_fit)
        return plan
    return _fill(plan, ctx, best, n)


def _choose_chips(ctx, goal: Goal, min_fit, notes, layout=None) -> tuple[int, search.Evaluated | None, str]:
    """(chip count, its best layout or None, reason it cannot run or "")."""
    system, chips = ctx.system, goal.chips
    if chips is not None:
        if chips > system.max_chips:
            return chips, None, f"{system.name} allows at most {system.max_chips} chip(s); {chips} requested."
        best = search.best_layout(ctx, chips, layout)
        if best is None and layout is not None:
            return chips, None, (f"the layout {layout} does not fit (or does not divide {chips} chips) "
                                 f"on {system.name} with the {ctx.stack.key} stack")
        return chips, best, ""
    if goal.deadline_h is not None or goal.budget_usd is not None:
        n, why = search.chips_for_goal(ctx, min_fit, goal.deadline_h, goal.budget_usd)
        return n, None if why else search.best_layout(ctx, n), why
    n = system.default_chips
    if min_fit is not None and min_fit > n:
        notes.append(f"{n} chips (the target's default) do not fit; planned at the {min_fit} that do")
        n = min_fit
    best = search.best_layout(ctx, n)
    if best is None and min_fit is not None and min_fit < n:
        # the default size is more than this job can use (small batch, few heads or layers)
        options = [(m, search.best_layout(ctx, m)) for m in search.chip_counts(system, min_fit, n - 1)]
        options = [(search.stage_seconds(ctx, ev, m), m, ev) for m, ev in options if ev is not None]
        if options:
            _, n, best = min(options, key=lambda o: (o[0], o[1]))     # fastest, then fewer chips
            notes.append(f"this job cannot use all {system.default_chips} chips "
                         f"({wl_shape(ctx.workload, ctx.spec)}); planned on {n}")
    return n, best, ""


def wl_shape(wl: Workload, spec: ModelSpec) -> str:
    return f"global batch {wl.global_batch} sequences, {spec.heads} heads, {spec.layers} layers"


def _catalog_notes(system: System, ctx: search.Context, spec: ModelSpec) -> list[str]:
    notes = []
    if system.chip.status == "projection":
        notes.append(f"{system.chip.name} is a projection from announced ratios, not a product")
    shown = {"system_w_per_chip": "power", "mfu": "MFU", "peak_tflops": "peak FLOP/s", "hbm_gib": "HBM"}
    guessed = [label for key, label in shown.items() if key in system.chip.estimated]
    if guessed and system.chip.status != "local":
        notes.append(f"{system.chip.name}: {', '.join(guessed)} estimated (nothing published); see hardware.yaml")
    if system.price_kind != "published":
        notes.append(f"price ({system.price_kind}): {system.price_source}")
    cal = system.chip.calibration
    if system.chip.status == "local":
        if ctx.precision in cal.get("effective_tflops", {}):
            notes.append(f"local rate {cal.get('source') or 'calibrated'}" +
                         (f" ({cal['runs']} run(s))" if cal.get("runs") else ""))
        else:
            notes.append("local rate uncalibrated (a guess): forge run and forge plan RECIPE measure this machine, "
                         "or fit it from past runs with `forge plan --calibrate --runs OUTPUT`")
    if spec.is_moe:
        notes.append("MoE: experts sharded by ZeRO/TP only; expert parallelism and all-to-all not modelled")
    if ctx.stack is not None and system.chip.status != "local":
        notes.append(f"stack: {ctx.stack.name} (--stack {ctx.stack.key}); matmul efficiency "
                     f"{ctx.mfu:.2f} of peak, overheads modelled separately")
    return notes


def _shell(spec, wl: Workload, system: System, ctx, n: int, min_fit, notes) -> StagePlan:
    pc = ctx.pc
    return StagePlan(
        stage=wl.name, kind=wl.kind, model=spec.name, params_total=pc.total, params_active=pc.active,
        target=system.key, system=system.name, chip=system.chip.name, chips=n, precision=wl.precision,
        feasible=True, seq_len=wl.seq_len, global_batch=wl.global_batch, steps=wl.steps,
        tokens_trained=wl.tokens_trained, tokens_processed=wl.tokens_processed,
        flops_per_token=training_flops_per_token(spec, wl.seq_len), mfu_assumed=ctx.mfu,
        usable_gib=system.usable_bytes / GIB, min_chips_fit=min_fit,
        usd_per_chip_hour=system.usd_per_chip_hour, price_kind=system.price_kind, notes=notes,
        flops_total=search.stage_model_flops(ctx), stack=ctx.stack.key if ctx.stack else "",
    )


def _fill(plan: StagePlan, ctx, best: search.Evaluated, n: int) -> StagePlan:
    spec, wl, system = ctx.spec, ctx.workload, ctx.system
    layout, step = best.layout, best.step
    slots = layout.global_batch
    if slots > wl.global_batch * 1.01:
        plan.notes.append(
            f"{layout.describe()} has {slots} sequence slots per step for a global batch of "
            f"{wl.global_batch}: {1 - wl.global_batch / slots:.0%} of micro-steps idle")
    gen_s = search.generation_seconds(ctx, n) if wl.generation else 0.0
    pre_s = wl.pre_pass_sequences * wl.seq_len * forward_flops_per_token(spec, wl.seq_len) / (n * ctx.sustained)
    seconds = search.stage_seconds(ctx, best, n)
    flops = search.stage_model_flops(ctx)
    hours = seconds / 3600
    kwh = n * hours * system.chip.system_w_per_chip / 1000
    plan.layout = layout.describe()
    plan.layout_detail = layout.as_dict()
    plan.flops_total = flops
    plan.step_time_s = step.total + gen_s
    plan.step_breakdown_s = {k: v for k, v in asdict(step).items()}
    if gen_s:
        plan.step_breakdown_s["generation"] = gen_s
    plan.generation_s_per_step = gen_s
    plan.hours = hours
    plan.chip_hours = n * hours
    plan.cost_usd = n * hours * system.usd_per_chip_hour
    plan.energy_kwh = kwh
    plan.tokens_per_mwh = wl.tokens_processed / (kwh / 1000) if kwh else 0.0
    plan.mfu_achieved = flops / (seconds * n * system.chip.peak_flops(ctx.precision)) if seconds else 0.0
    mem = best.memory
    plan.memory_gib = {k: v / GIB for k, v in asdict(mem).items()}
    if pre_s:
        plan.notes.append(f"reference log-probs cached once up front: {pre_s / 3600:.2f} h of the total")
    return plan


def infeasible_plan(model, wl: Workload, system: System, chips: int | None, reason: str) -> StagePlan:
    spec = as_spec(model)
    pc = count_parameters(spec)
    return StagePlan(
        stage=wl.name, kind=wl.kind, model=spec.name, params_total=pc.total, params_active=pc.active,
        target=system.key, system=system.name, chip=system.chip.name, chips=chips or system.default_chips,
        precision=wl.precision, feasible=False, reason=reason, seq_len=wl.seq_len,
        global_batch=wl.global_batch, steps=wl.steps, tokens_trained=wl.tokens_trained,
        tokens_processed=wl.tokens_processed, usd_per_chip_hour=system.usd_per_chip_hour,
        price_kind=system.price_kind)
