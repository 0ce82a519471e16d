"""The local target's rate for a recipe, and which one it is: a calibration file (`--calibration`,
the recipe's compute.calibration, else OUTPUT/calibration.yaml that `forge plan --calibrate --runs
OUTPUT` writes), else a short measurement of each stage's step on this machine (forge.plan.measure),
cached in the output folder (local-rate.json, keyed by model shape and machine: a later run or plan
does not measure again), else the catalog's uncalibrated guess. `forge run` and `forge plan` both
plan with it and say which it was."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from forge.plan.calibrate import LOCAL_CHIP
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import deep_merge
from forge.plan.model import spec_from_config
from forge.rundir import RunLayout


@dataclass
class LocalRate:
    """How plans on `local` get their rate: kind calibrated | measured | cached | uncalibrated."""

    kind: str = "uncalibrated"
    text: str = "uncalibrated"             # said next to the plan: "calibrated from runs/x/calibration.yaml"
    file: Path | None = None               # the calibration file, or the measurement cache
    overlays: dict[str, dict] = field(default_factory=dict)  # stage name -> catalog overlay (measured)

    @property
    def tag(self) -> str:
        """A few words for each stage's line."""
        return {"calibrated": "calibrated rate", "measured": "measured rate", "cached": "measured rate"}.get(
            self.kind, "uncalibrated guess")

    def catalog_for(self, catalog: dict, stage: str) -> dict:
        """The catalog a stage's local plan uses (its measured rate merged in, if any)."""
        return deep_merge(catalog, self.overlays[stage]) if stage in self.overlays else catalog


def calibration_file(recipe) -> Path | None:
    """The recipe's compute.calibration, else a calibration.yaml in its output folder, else None."""
    given = getattr(getattr(recipe, "compute", None), "calibration", None)
    if given:
        return Path(given)
    out = getattr(recipe, "output", None)
    found = RunLayout(Path(out)).calibration if out else None
    return found if found is not None and found.is_file() else None


def name_calibration(catalog: dict, text: str) -> dict:
    """Mark the local chip's calibration in `catalog` with where it came from (its plans say so)."""
    cal = catalog.get("chips", {}).get(LOCAL_CHIP, {}).get("calibration")
    if isinstance(cal, dict) and cal.get("effective_tflops"):
        cal.setdefault("source", text)
    return catalog


# ------------------------------------------------------------------ measured, and cached
def _key(model_config: dict, shape, machine: dict) -> str:
    spec = asdict(spec_from_config(model_config))
    spec.pop("name", None)
    blob = json.dumps({"spec": spec, "shape": asdict(shape), "machine": machine}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {"entries": {}}
    except (OSError, ValueError):
        return {"entries": {}}  # none yet, or unreadable: measured again and rewritten


def _write_cache(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _overlay(model_config: dict, shape, step_s: float, basis: str) -> dict:
    """The measured step as the local chip's rate at this shape: FLOP/s = the step's training FLOPs
    (as the planner counts them) over its measured seconds; no separate per-step overhead."""
    flops = training_flops_per_token(spec_from_config(model_config), shape.seq_len) * shape.seq_len \
        * shape.sequences * shape.accum
    cal = {"effective_tflops": {shape.precision: flops / step_s / 1e12}, "step_overhead_s": {shape.precision: 0.0},
           "rel_error": 0.25, "runs": 0, "source": basis, "basis": basis}
    return {"chips": {LOCAL_CHIP: {"calibration": cal}}}


def measured(model_config: dict, shapes: dict, out: Path | None, log: Callable[[str], None]) -> LocalRate:
    """Each stage's rate (`shapes`: stage name -> measure.Shape) from the cache in `out`, else
    measured now (and cached there); a stage too large to measure keeps the uncalibrated guess."""
    from forge.plan import measure

    machine = measure.machine()
    path = RunLayout(Path(out)).local_rate if out else None
    cache = _read_cache(path) if path is not None else {"entries": {}}
    rate, fresh = LocalRate("cached", "", path), False
    skipped = []
    for stage, shape in shapes.items():
        key = _key(model_config, shape, machine)
        entry = cache["entries"].get(key)
        if entry is None:
            why = measure.too_big(model_config, shape)
            if why:
                skipped.append(f"{stage}: {why}")
                continue
            log(f"measuring this machine: a few training steps of {stage}'s model "
                f"({shape.sequences} x {shape.seq_len} tokens, {shape.precision})")
            try:
                entry = {**measure.measure(model_config, shape), "shape": asdict(shape), "machine": machine,
                         "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
            except Exception as e:  # noqa: BLE001 (a model this torch cannot build, no memory): the guess, and why
                skipped.append(f"{stage}: could not measure it ({type(e).__name__}: {e})")
                continue
            cache["entries"][key], fresh = entry, True
        rate.overlays[stage] = _overlay(model_config, shape, float(entry["step_time_s"]),
                                        f"measured here ({entry['timed_steps']} step(s) at this shape, "
                                        f"{entry['measured']})")
    if fresh and path is not None:
        try:
            _write_cache(path, cache)
        except OSError:  # an output folder that cannot be written (yet): measured again next time
            path = None
    if not rate.overlays:
        return LocalRate(text="uncalibrated" + (f" ({'; '.join(skipped)})" if skipped else ""))
    where = f", cached in {path}" if path is not None else ""
    rate.kind = "measured" if fresh else "cached"
    rate.text = ("measured here just now" if fresh else "measured here earlier") + where
    if skipped:
        rate.text += f"; uncalibrated for {'; '.join(skipped)}"
    return rate
