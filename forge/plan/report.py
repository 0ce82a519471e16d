"""Presenting plans: a terminal table, JSON, the MLflow payload (plain data; forge/track.py logs
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


def to_json(plans: list[StagePlan]) -> str:
    return json.dumps([p.as_dict() for p in plans], indent=2, default=str)


def plan_tracking_payload(plan: StagePlan) -> tuple[dict, dict, dict]:
    """(params, metrics, artifacts) for the stage's MLflow run; forge/track.py does the logging."""
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


def plot_plans(plans: list[StagePlan], path: str | Path) -> Path:
    """Bar chart of hours and cost per target (Agg canvas; no pyplot global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [p for p in plans if p.feasible]
    multi_stage = len({p.stage for p in plans}) > 1
    labels = [(f"{p.stage}: " if multi_stage else "") + f"{p.target}\n{p.chips} chips" for p in ok]
    fig = Figure(figsize=(max(6.0, 1.6 * len(ok) + 2), 4.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, values, title in ((axes[0], [p.hours for p in ok], "wall-clock hours"),
                              (axes[1], [p.cost_usd for p in ok], "cost (USD)")):
        bars = ax.bar(range(len(ok)), values, color=["#d9822b" if "trn" in p.target else "#4a7ab5" for p in ok],
                      yerr=[v * p.error_band for v, p in zip(values, ok)], capsize=3)
        ax.set_xticks(range(len(ok)), labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 10 else f"{v:.2g}" for v in values], fontsize=7)
    if plans:
        missing = [p.target for p in plans if not p.feasible]
        sub = f" (does not fit: {', '.join(missing)})" if missing else ""
        fig.suptitle(f"{plans[0].model}: {plans[0].kind} {_tokens(plans[0].tokens_processed)} tokens{sub}",
                     fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def assert_plans_fit(plans: list[StagePlan], force: bool = False) -> list[str]:
    """Raise ForgeError naming each stage that cannot run on its target (unless force); returns
    the problems as warnings when forced."""
    problems = [f"stage {p.stage!r} on {p.target} ({p.chips} chips): {p.reason}" for p in plans if not p.feasible]
    if problems and not force:
        raise ForgeError("the plan says these stages cannot run; fix the recipe or pass --force:\n  "
                         + "\n  ".join(problems))
    return problems
