"""Presenting plans: a terminal table, JSON, the MLflow payload (plain data; forge/track/ logs
it), a PNG chart across targets, and the fit check `forge run` applies before a stage."""
from __future__ import annotations

import json
from pathlib import Path

from forge.errors import ForgeError
from forge.plan.planner import StagePlan


def _adaptive(x: float) -> str:
    """Thousands separators for big numbers, two significant digits for small ones."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def _sci(x: float) -> str:
    return f"{x:.3g}"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n:,}"


def _tokens(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


COLUMNS = [("target", 26, "<"), ("chips", 6, ">"), ("layout", 36, "<"), ("mem/chip GiB", 13, ">"),
           ("step s", 8, ">"), ("hours", 9, ">"), ("chip-h", 9, ">"), ("cost $", 11, ">"), ("+-", 5, ">"),
           ("kWh", 8, ">"), ("Btok/MWh", 9, ">"), ("MFU", 5, ">")]


def band_text(band: float) -> str:
    """The relative error band of a plan's times and costs, e.g. '12%'."""
    return f"{band:.0%}" if band else ""


def band_range(value: float, band: float) -> tuple[float, float]:
    """(low, high) of a time or cost under a relative band."""
    return value * max(0.0, 1 - band), value * (1 + band)


def _row(cells: list[str]) -> str:
    return "  ".join(f"{c:{align}{w}}" for c, (_, w, align) in zip(cells, COLUMNS)).rstrip()


def format_table(plans: list[StagePlan]) -> str:
    """Readable plain-text table, grouped by stage, with numbered notes below."""
    lines: list[str] = []
    notes: list[str] = []
    stages: dict[str, list[StagePlan]] = {}
    for p in plans:
        stages.setdefault(p.stage, []).append(p)
    for name, group in stages.items():
        p0 = group[0]
        active = f" ({_params(p0.params_active)} active)" if p0.params_active != p0.params_total else ""
        flops = max((p.flops_total for p in group), default=0.0)
        lines.append(
            f"Stage {name!r} ({p0.kind}): {p0.model} {_params(p0.params_total)} params{active} | "
            f"{_tokens(p0.tokens_processed)} tokens at seq {p0.seq_len} | {p0.precision} | "
            f"{_sci(flops)} FLOPs")
        lines.append(_row([c for c, _, _ in COLUMNS]))
        for p in group:
            marks = []
            band_note = (f"+- {band_text(p.error_band)} on {p.target}'s times and costs: {p.band_basis}"
                         if p.band_basis else "")
            for note in p.notes + ([band_note] if band_note else []):
                if note not in notes:
                    notes.append(note)
                marks.append(str(notes.index(note) + 1))
            target = p.target + (f" [{','.join(marks)}]" if marks else "")
            if not p.feasible:
                lines.append(_row([target, str(p.chips), "DOES NOT FIT"]))
                lines.append(f"    {p.reason}")
                continue
            mem = f"{_adaptive(p.memory_gib['total'])}/{p.usable_gib:.0f}"
            lines.append(_row([
                target, str(p.chips), p.layout, mem, f"{p.step_time_s:.3g}", _adaptive(p.hours),
                _adaptive(p.chip_hours), _adaptive(p.cost_usd), band_text(p.error_band), _adaptive(p.energy_kwh),
                f"{p.tokens_per_mwh / 1e9:.2f}", f"{p.mfu_achieved:.2f}"]))
        lines.append("")
    for i, note in enumerate(notes, 1):
        lines.append(f"[{i}] {note}")
    return "\n".join(lines).rstrip() + "\n"


def duration_text(seconds: float) -> str:
    """'<0.1 s', '~0.25 s', '~40 s', '~1.5 min', '~2.3 h', '~3.1 days'."""
    if seconds < 0.1:
        return "<0.1 s"
    if seconds < 90:
        return f"~{seconds:.2g} s" if seconds < 10 else f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.2g} min"
    return f"~{seconds / 3600:.2g} h" if seconds < 3 * 86400 else f"~{seconds / 86400:,.1f} days"


def _where(p: StagePlan) -> str:
    return "here" if p.target == "local" else f"on {p.target} x{p.chips}"


def stage_lines(local: list[StagePlan], target: list[StagePlan], tag: str) -> list[str]:
    """One plain line per stage: its steps and the time predicted here (`tag`: which rate), and on
    the recipe's own target when that is not this machine, e.g.
    'sft (sft): 120 steps, ~1.5 min here (measured rate), ~2 s on trn3-ultraserver x16'."""
    others = {p.stage: p for p in target if p.target != "local"}
    lines = []
    for p in local:
        here = f"{duration_text(p.hours * 3600)} here ({tag})" if p.feasible else "does not fit here"
        line = f"{p.stage} ({p.kind}): {p.steps:,} steps, {here}"
        t = others.get(p.stage)
        if t is not None:
            line += f", {duration_text(t.hours * 3600)} {_where(t)}" if t.feasible else f", does not fit {_where(t)}"
        lines.append(line)
    return lines


def to_json(plans: list[StagePlan]) -> str:
    return json.dumps([p.as_dict() for p in plans], indent=2, default=str)


def plan_tracking_payload(plan: StagePlan) -> tuple[dict, dict, dict]:
    """(params, metrics, artifacts) for the stage's MLflow run; forge/track/ does the logging."""
    params = {
        "plan.target": plan.target, "plan.chips": plan.chips, "plan.layout": plan.layout or "none",
        "plan.precision": plan.precision, "plan.feasible": plan.feasible, "plan.stack": plan.stack or "none",
    }
    metrics = {}
    if plan.feasible:
        metrics = {
            "plan.hours": plan.hours, "plan.cost_usd": plan.cost_usd, "plan.chip_hours": plan.chip_hours,
            "plan.energy_kwh": plan.energy_kwh, "plan.step_time_s": plan.step_time_s,
            "plan.flops_total": plan.flops_total, "plan.mfu_assumed": plan.mfu_assumed,
            "plan.mem_per_chip_gib": plan.memory_gib.get("total", 0.0), "plan.tokens_per_mwh": plan.tokens_per_mwh,
            "plan.error_band": plan.error_band,
        }
    artifacts = {
        "plan.json": to_json([plan]).encode(),
        "plan.txt": format_table([plan]).encode(),
    }
    return params, metrics, artifacts


def _hours_text(h: float) -> str:
    s = h * 3600
    return f"{s:.2g} s" if s < 90 else f"{s / 60:.2g} min" if s < 5400 else f"{h:,.3g} h"


def _usd_text(v: float) -> str:
    return f"${v:,.0f}" if v >= 100 else f"${v:.3g}"


def plot_plans(plans: list[StagePlan], path: str | Path, measured_hours: dict[str, float] | None = None) -> Path:
    """The chart of plan_figure as a PNG at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plan_figure(plans, measured_hours).savefig(path, format="png")
    return path


def plan_figure(plans: list[StagePlan], measured_hours: dict[str, float] | None = None):
    """Horizontal bars of wall-clock time and cost per target (Agg canvas; no pyplot global state).
    Targets read on one axis; each bar carries its value, chips and layout; an axis is logarithmic
    when its values span more than two orders of magnitude; `measured_hours` (target -> hours)
    draws what a run measured beside the prediction."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [p for p in plans if p.feasible]
    multi_stage = len({p.stage for p in plans}) > 1
    labels = [(f"{p.stage}: " if multi_stage else "") + p.target for p in ok]
    fig = Figure(figsize=(11.0, 1.4 + 0.55 * max(1, len(ok))), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    measured_hours = measured_hours or {}
    axes[0].invert_yaxis()  # the first target on top (the axis is shared: inverted once)
    for ax, values, title, unit, fmt in ((axes[0], [p.hours for p in ok], "wall-clock time", "hours", _hours_text),
                                         (axes[1], [p.cost_usd for p in ok], "cost", "USD", _usd_text)):
        y = list(range(len(ok)))
        ax.barh(y, values, color=["#d9822b" if "trn" in p.target else "#4a7ab5" for p in ok],
                xerr=[v * p.error_band for v, p in zip(values, ok)], capsize=3, height=0.6)
        positive = [v for v in values if v > 0]
        if positive and max(positive) / min(positive) > 100:
            ax.set_xscale("log")
        for i, (v, p) in enumerate(zip(values, ok)):
            layout = f", {p.layout}" if p.layout and ax is axes[0] else ""
            ax.annotate(f" {fmt(v)}  ({p.chips} chips{layout})", (v * (1 + p.error_band), i), va="center", fontsize=7,
                        xytext=(2, 0), textcoords="offset points", clip_on=False)
        if ax is axes[0]:
            hits = [(i, measured_hours[p.target]) for i, p in enumerate(ok) if p.target in measured_hours]
            if hits:
                ax.plot([h for _, h in hits], [i for i, _ in hits], "kD", markersize=5, label="measured")
                ax.legend(fontsize=7, loc="lower right")
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(unit, fontsize=8)
        ax.margins(x=0.9 if ax.get_xscale() == "log" else 0.6)  # room for the text after each bar
        ax.tick_params(axis="x", labelsize=7)
    if plans:
        missing = [p.target for p in plans if not p.feasible]
        sub = f" (does not fit: {', '.join(missing)})" if missing else ""
        fig.suptitle(f"{plans[0].model}: {plans[0].kind} {_tokens(plans[0].tokens_processed)} tokens{sub}",
                     fontsize=10)
    fig.tight_layout()
    return fig


def assert_plans_fit(plans: list[StagePlan], force: bool = False) -> list[str]:
    """Raise ForgeError naming each stage that cannot run on its target (unless force); returns
    the problems as warnings when forced."""
    problems = [f"stage {p.stage!r} on {p.target} ({p.chips} chips): {p.reason}" for p in plans if not p.feasible]
    if problems and not force:
        raise ForgeError("the plan says these stages cannot run; fix the recipe or pass --force:\n  "
                         + "\n  ".join(problems))
    return problems
