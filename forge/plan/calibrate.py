"""Calibration of the `local` target: record predicted vs measured steps, fit this machine's
effective FLOP/s, and write it to the user's hardware file so later local plans use it.

Model: step_time = flops_per_step / R + c (R effective FLOP/s, c fixed per-step overhead such as
data loading and optimizer), fitted by least squares per precision over past runs.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from forge.errors import ForgeError
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import get_system, load_catalog, user_hardware_file
from forge.plan.memory import memory_per_chip
from forge.plan.model import count_parameters, spec_from_config
from forge.plan.parallel import Layout

MEASUREMENTS = "measurements.jsonl"
LOCAL_CHIP = "local-cpu"


def default_store_dir() -> Path:
    """Where runs record measurements: $FORGE_CALIBRATION_DIR, else ~/.cache/forge/calibration."""
    env = os.environ.get("FORGE_CALIBRATION_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/forge/calibration").expanduser()


def record_measurement(store_dir: str | Path | None, predicted: dict, measured: dict, **meta) -> Path:
    """Append one run's predicted and measured figures (step_time_s, tokens_per_s, peak_mem_bytes,
    flops_per_step, precision, ...) to store_dir/measurements.jsonl; returns the file."""
    if "step_time_s" not in measured:
        raise ForgeError("a calibration measurement needs measured['step_time_s']")
    store = Path(store_dir) if store_dir else default_store_dir()
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


def load_measurements(store_dir: str | Path | None = None) -> list[dict]:
    """All recorded measurements under store_dir (searched recursively, so an MLflow or runs tree works)."""
    store = Path(store_dir) if store_dir else default_store_dir()
    rows = []
    for path in sorted(store.rglob(MEASUREMENTS)) if store.is_dir() else []:
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


@dataclass
class Calibration:
    effective_tflops: dict = field(default_factory=dict)   # precision -> sustained TFLOP/s
    step_overhead_s: dict = field(default_factory=dict)    # precision -> seconds per step
    memory_scale: float = 1.0                               # measured / predicted peak memory
    runs: int = 0
    rel_error: float = 0.0                                  # median |fit - measured| / measured
    fitted_at: str = ""


def _flops(row: dict) -> float | None:
    return row["measured"].get("flops_per_step") or row["predicted"].get("flops_per_step")


def _precision(row: dict) -> str:
    return row["measured"].get("precision") or row["predicted"].get("precision") or "fp32"


def fit_calibration(rows: list[dict]) -> Calibration:
    """Least-squares fit of step_time = F / R + c per precision (c >= 0)."""
    usable = [r for r in rows if _flops(r) and r["measured"].get("step_time_s")]
    if not usable:
        raise ForgeError("no usable calibration measurements (each needs flops_per_step and step_time_s); "
                         "run a local stage first")
    cal = Calibration(runs=len(usable), fitted_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    errors = []
    for prec in sorted({_precision(r) for r in usable}):
        pts = [(float(_flops(r)), float(r["measured"]["step_time_s"])) for r in usable if _precision(r) == prec]
        slope, icpt = _line(pts)
        cal.effective_tflops[prec] = 1.0 / slope / 1e12
        cal.step_overhead_s[prec] = icpt
        errors += [abs(f * slope + icpt - t) / t for f, t in pts]
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


def write_calibration(cal: Calibration, path: str | Path | None = None) -> Path:
    """Merge the calibration into the user's hardware file (chips.local-cpu.calibration)."""
    path = Path(path) if path else user_hardware_file()
    data = {}
    if path.is_file():
        data = yaml.safe_load(path.read_text()) or {}
    chips = data.setdefault("chips", {})
    chips.setdefault(LOCAL_CHIP, {})["calibration"] = {
        k: v for k, v in asdict(cal).items() if not (isinstance(v, float) and math.isnan(v))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# forge hardware overrides (written by `forge plan --calibrate`; edit freely)\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return path


def calibrate(store_dir: str | Path | None = None, path: str | Path | None = None) -> tuple[Calibration, Path]:
    """Fit from the recorded runs and write the result; returns (calibration, file written)."""
    cal = fit_calibration(load_measurements(store_dir))
    return cal, write_calibration(cal, path)


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
