"""Calibration of the `local` target: each run records predicted vs measured steps in its own
output folder; `forge plan --calibrate --runs DIR` fits this machine's effective FLOP/s from the
runs under DIR (rejecting outliers, naming the runs it used) and writes a calibration file that
plans use only when asked (`forge plan --calibration FILE`). Nothing is written to the home folder
and nothing changes later plans silently.

Model: step_time = flops_per_step / R + c (R effective FLOP/s, c fixed per-step overhead such as
data loading and optimizer), fitted by least squares per precision over past runs.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from forge.errors import ForgeError
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import get_system, load_catalog
from forge.plan.memory import memory_per_chip
from forge.plan.model import count_parameters, spec_from_config
from forge.plan.parallel import Layout
from forge.rundir import RunLayout

MEASUREMENTS = "measurements.jsonl"
LOCAL_CHIP = "local-cpu"
OUTLIER = 0.25      # a run whose step time is off the first fit by more than this (and 3 MADs) is rejected


def record_measurement(run_dir: str | Path, predicted: dict, measured: dict, **meta) -> Path:
    """Append one run's predicted and measured figures (step_time_s, tokens_per_s, peak_mem_bytes,
    flops_per_step, precision, ...) to run_dir/measurements.jsonl, in the run's own output folder;
    returns the file."""
    if "step_time_s" not in measured:
        raise ForgeError("a calibration measurement needs measured['step_time_s']")
    if not run_dir:
        raise ForgeError("a calibration measurement belongs to a run: pass the run's output folder")
    store = Path(run_dir)
    store.mkdir(parents=True, exist_ok=True)
    path = store / MEASUREMENTS
    row = {"time": time.time(), "target": "local", "predicted": predicted, "measured": measured, **meta}
    with path.open("a") as fh:
        fh.write(json.dumps(row, default=float) + "\n")
    return path


COMPARED = ("step_time_s", "tokens_per_s", "peak_mem_bytes")


def comparison_metrics(predicted: dict, measured: dict) -> dict:
    """Flat MLflow metrics of predicted vs measured: plan.predicted.X, plan.measured.X and
    plan.measured_over_predicted.X for step time, tokens/s and peak memory."""
    out = {}
    for key in COMPARED:
        p, m = predicted.get(key), measured.get(key)
        if p is not None:
            out[f"plan.predicted.{key}"] = float(p)
        if m is not None:
            out[f"plan.measured.{key}"] = float(m)
        if p and m is not None:
            out[f"plan.measured_over_predicted.{key}"] = float(m) / float(p)
    return out


def load_measurements(store_dir: str | Path) -> list[dict]:
    """All recorded measurements under store_dir (a run's output folder or a workspace of runs,
    searched recursively); each row gets `run`: the folder it came from, relative to store_dir."""
    store = Path(store_dir)
    if not store.is_dir():
        raise ForgeError(f"--runs {store}: no such folder (give a run's output folder or a workspace of runs)")
    rows = []
    for path in sorted(store.rglob(MEASUREMENTS)):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ForgeError(f"{path}:{i}: not a JSON measurement ({exc})") from None
            rel = path.parent.relative_to(store)
            row["run"] = str(rel) if str(rel) != "." else store.name
            rows.append(row)
    return rows


@dataclass
class Calibration:
    effective_tflops: dict = field(default_factory=dict)   # precision -> sustained TFLOP/s
    step_overhead_s: dict = field(default_factory=dict)    # precision -> seconds per step
    memory_scale: float = 1.0                               # measured / predicted peak memory
    runs: int = 0
    rel_error: float = 0.0                                  # median |fit - measured| / measured
    fitted_at: str = ""
    used: list = field(default_factory=list)                # the runs (folders) the fit used
    rejected: list = field(default_factory=list)            # outliers left out, with their error


def _flops(row: dict) -> float | None:
    return row["measured"].get("flops_per_step") or row["predicted"].get("flops_per_step")


def _precision(row: dict) -> str:
    return row["measured"].get("precision") or row["predicted"].get("precision") or "fp32"


def _point(r: dict) -> tuple[float, float]:
    return float(_flops(r)), float(r["measured"]["step_time_s"])


def _outliers(group: list[dict]) -> list[tuple[dict, float]]:
    """Rows off a first fit by more than OUTLIER and 3 median absolute deviations (a run slowed by
    another job on the machine, say), with their relative error; none with fewer than 3 rows."""
    if len(group) < 3:
        return []
    slope, icpt = _line([_point(r) for r in group])
    errs = [((f * slope + icpt) - t) / t for f, t in map(_point, group)]
    med = statistics.median(errs)
    mad = statistics.median(abs(e - med) for e in errs) or 1e-12
    return [(r, e) for r, e in zip(group, errs) if abs(e - med) > max(OUTLIER, 3 * mad)]


def _label(r: dict) -> str:
    return str(r.get("run") or r.get("stage") or "?") + (f"/{r['stage']}" if r.get("run") and r.get("stage") else "")


def fit_calibration(rows: list[dict]) -> Calibration:
    """Least-squares fit of step_time = F / R + c per precision (c >= 0), outliers rejected."""
    usable = [r for r in rows if _flops(r) and r["measured"].get("step_time_s")]
    if not usable:
        raise ForgeError("no usable calibration measurements (each needs flops_per_step and step_time_s); "
                         "run a local stage first")
    cal = Calibration(fitted_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    errors, kept_all = [], []
    for prec in sorted({_precision(r) for r in usable}):
        group = [r for r in usable if _precision(r) == prec]
        bad = _outliers(group)
        cal.rejected += [f"{_label(r)} ({e:+.0%} off the fit)" for r, e in bad]
        kept = [r for r in group if all(r is not b for b, _ in bad)]
        pts = [_point(r) for r in kept]
        slope, icpt = _line(pts)
        cal.effective_tflops[prec] = 1.0 / slope / 1e12
        cal.step_overhead_s[prec] = icpt
        errors += [abs(f * slope + icpt - t) / t for f, t in pts]
        kept_all += kept
    usable = kept_all
    cal.runs = len(usable)
    cal.used = sorted({_label(r) for r in usable})
    cal.rel_error = statistics.median(errors)
    ratios = [r["measured"]["peak_mem_bytes"] / r["predicted"]["peak_mem_bytes"] for r in usable
              if r["measured"].get("peak_mem_bytes") and r["predicted"].get("peak_mem_bytes")]
    cal.memory_scale = statistics.median(ratios) if ratios else 1.0
    return cal


def _line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of t = slope*F + intercept; through the origin when F does not vary or
    the free fit gives a negative intercept."""
    fs = [f for f, _ in pts]
    if len(set(fs)) >= 2:
        mf, mt = statistics.fmean(fs), statistics.fmean(t for _, t in pts)
        var = sum((f - mf) ** 2 for f in fs)
        slope = sum((f - mf) * (t - mt) for f, t in pts) / var
        icpt = mt - slope * mf
        if slope > 0 and icpt >= 0:
            return slope, icpt
    slope = sum(f * t for f, t in pts) / sum(f * f for f in fs)
    return slope, 0.0


def write_calibration(cal: Calibration, path: str | Path) -> Path:
    """Write the calibration as a hardware overlay (chips.local-cpu.calibration) that a plan applies
    only when given it: `forge plan --calibration FILE` (or --hardware FILE)."""
    path = Path(path)
    data = {"chips": {LOCAL_CHIP: {"calibration": {
        k: v for k, v in asdict(cal).items() if not (isinstance(v, float) and math.isnan(v))}}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# forge calibration of the local target (written by `forge plan --calibrate`);\n"
                    "# applied only where asked: forge plan --calibration THIS_FILE\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return path


def calibrate(store_dir: str | Path, path: str | Path | None = None) -> tuple[Calibration, Path]:
    """Fit from the runs recorded under store_dir and write the result (default:
    store_dir/calibration.yaml); returns (calibration, file written)."""
    cal = fit_calibration(load_measurements(store_dir))
    return cal, write_calibration(cal, path or RunLayout(Path(store_dir)).calibration)  # a run's, or the workspace's


def predict_local_step(model_config: dict, seq_len: int, micro_batch: int, grad_accum: int = 1,
                       precision: str = "fp32", catalog: dict | None = None) -> dict:
    """What the planner expects of one optimizer step on this machine, for logging next to what a
    run measures (and, via record_measurement, for calibration)."""
    spec = spec_from_config(model_config)
    pc = count_parameters(spec)
    system = get_system("local", catalog if catalog is not None else load_catalog())
    chip = system.chip
    cal = chip.calibration or {}
    layout = Layout(micro_batch=micro_batch, microbatches=grad_accum)
    mem = memory_per_chip(spec, pc, layout, seq_len, precision, flash=True)
    tokens = seq_len * micro_batch * grad_accum
    flops = training_flops_per_token(spec, seq_len) * tokens
    overhead = float((cal.get("step_overhead_s") or {}).get(precision, 0.0))
    seconds = flops / chip.sustained_flops(precision) + overhead
    return {
        "target": "local", "precision": precision, "calibrated": precision in cal.get("effective_tflops", {}),
        "flops_per_step": flops, "tokens_per_step": tokens, "step_time_s": seconds,
        "tokens_per_s": tokens / seconds, "peak_mem_bytes": mem.total * float(cal.get("memory_scale", 1.0)),
        "model_state_bytes": mem.weights + mem.grads + mem.optimizer, "activation_bytes": mem.activations,
    }
