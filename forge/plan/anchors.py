"""Anchors: published training runs (anchors.yaml) replayed through the planner, and the error
band every plan carries, derived from how far the replays land from what was published.

A replay plans the anchor's model, sequence length, global batch and precision on its target at
its chip count, with its stack and the layout dimensions it published (free ones are searched),
and compares the step time with the published one. Nothing is fitted per anchor.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from forge.errors import ForgeError
from forge.plan import workloads as W
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import PACKAGE_CATALOG, deep_merge, get_system, read_yaml, resolve_name
from forge.plan.model import load_model_config, spec_from_config
from forge.plan.stage_plan import Goal, Setup, plan_unbanded

ANCHORS_FILE = Path(__file__).with_name("anchors.yaml")
UNITS = ("tokens_per_s_per_chip", "sequences_per_s", "tflops_per_chip")
# error-band terms (relative): the floor of an anchored band, extrapolation beyond 4x the largest
# anchored chip count, and a chip no published run anchors (available / announced projection)
BAND_FLOOR, BAND_SCALE, BAND_NO_STACK, BAND_UNANCHORED_CHIP, BAND_PROJECTION = 0.05, 0.10, 0.10, 0.25, 0.50

FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: the same data, faster


def load_anchors(path: str | Path = ANCHORS_FILE) -> list[dict]:
    rows = (yaml.load(Path(path).read_text(), Loader=FAST) or {}).get("anchors", [])
    for a in rows:
        missing = [k for k in ("name", "source", "model", "target", "chips", "precision", "seq_len",
                               "global_batch", "stack", "published") if k not in a]
        if missing:
            raise ForgeError(f"anchor {a.get('name', '?')!r} in {path} lacks {', '.join(missing)}")
        if a["published"].get("unit") not in UNITS:
            raise ForgeError(f"anchor {a['name']!r}: published.unit must be one of {', '.join(UNITS)}")
    return rows


def package_catalog() -> dict:
    """The built-in catalog alone: anchors judge forge's figures, not a user's overrides."""
    data = read_yaml(PACKAGE_CATALOG)
    data["files"] = [str(PACKAGE_CATALOG)]
    return data


def published_step_seconds(anchor: dict, flops_per_token: float) -> float:
    """The published figure as seconds per optimizer step."""
    tokens = anchor["global_batch"] * anchor["seq_len"]
    value, unit = float(anchor["published"]["value"]), anchor["published"]["unit"]
    if unit == "tokens_per_s_per_chip":
        return tokens / (value * anchor["chips"])
    if unit == "sequences_per_s":
        return anchor["global_batch"] / value
    return flops_per_token * tokens / (value * 1e12 * anchor["chips"])


def in_unit(anchor: dict, step_s: float, flops_per_token: float) -> float:
    """A step time expressed in the anchor's published unit."""
    tokens = anchor["global_batch"] * anchor["seq_len"]
    unit = anchor["published"]["unit"]
    if unit == "tokens_per_s_per_chip":
        return tokens / (step_s * anchor["chips"])
    if unit == "sequences_per_s":
        return anchor["global_batch"] / step_s
    return flops_per_token * tokens / (step_s * anchor["chips"]) / 1e12


@dataclass(frozen=True)
class Replay:
    name: str
    stack: str
    chip: str
    chips: int
    predicted_s: float
    published_s: float
    predicted: float           # in the published unit
    published: float
    unit: str
    layout: str
    reason: str = ""
    known_miss: str = ""       # the anchor's `known_miss`: why forge's model misses it (it still counts in the band)

    @property
    def ratio(self) -> float:
        """Predicted over published step time (> 1: forge is slower than the published run)."""
        return self.predicted_s / self.published_s if self.predicted_s else math.inf


def anchor_catalog(anchor: dict, catalog: dict) -> dict:
    """The catalog an anchor replays on: `catalog` with the anchor's `hardware` overrides (where the
    published machine differs from the catalog's chip)."""
    if not anchor.get("hardware"):
        return catalog
    chip = get_system(anchor["target"], catalog).chip.key
    catalog = deep_merge(catalog, {"chips": {chip: anchor["hardware"]}})
    if "hbm_gb" in anchor["hardware"]:
        catalog["chips"][chip].pop("hbm_gib", None)
    return catalog


def anchor_model(anchor: dict) -> dict:
    """The anchor's model config: its inline `config` (a published config.json's fields), else the
    preset `model` names (models.yaml)."""
    return dict(anchor["config"]) if anchor.get("config") else load_model_config(anchor["model"])


def anchor_workload(anchor: dict) -> W.Workload:
    """One optimizer step of the anchor's pretraining run."""
    return W.pretrain(anchor["name"], anchor["seq_len"], anchor["global_batch"], steps=1,
                      precision=anchor["precision"])


def replay(anchor: dict, catalog: dict | None = None) -> Replay:
    catalog = anchor_catalog(anchor, catalog if catalog is not None else package_catalog())
    system = get_system(anchor["target"], catalog)
    config = anchor_model(anchor)
    fpt = training_flops_per_token(spec_from_config(config), anchor["seq_len"])
    wl = anchor_workload(anchor)
    plan = plan_unbanded(config, wl, anchor["target"], Goal(chips=anchor["chips"]),
                         Setup(stack=anchor["stack"], layout=dict(anchor.get("layout") or {})), catalog)
    published_s = published_step_seconds(anchor, fpt)
    unit = anchor["published"]["unit"]
    if not plan.feasible:
        return Replay(anchor["name"], anchor["stack"], system.chip.key, anchor["chips"], 0.0, published_s, 0.0,
                      float(anchor["published"]["value"]), unit, "", plan.reason)
    return Replay(anchor["name"], anchor["stack"], system.chip.key, anchor["chips"], plan.step_time_s,
                  published_s, in_unit(anchor, plan.step_time_s, fpt), float(anchor["published"]["value"]),
                  unit, plan.layout, known_miss=str(anchor.get("known_miss", "")))


def replay_all(catalog: dict | None = None, path: str | Path = ANCHORS_FILE) -> list[Replay]:
    return [replay(a, catalog) for a in load_anchors(path)]


@functools.lru_cache(maxsize=1)
def _package_replays() -> tuple[Replay, ...]:
    return tuple(replay_all())


def error_band(ratios: list[float], chips: int, max_anchored_chips: int, stack_anchored: bool,
               chip_term: float) -> float:
    """Relative +- band: the worst anchor miss of the stack (at least BAND_FLOOR), combined in
    quadrature with an extrapolation term past 4x the largest anchored scale, a term when the stack
    has no anchor of its own, and `chip_term` when no anchor ran on this chip."""
    base = max([BAND_FLOOR] + [abs(r - 1) for r in ratios if math.isfinite(r)])
    scale = BAND_SCALE if chips > 4 * max_anchored_chips else 0.0
    stack = 0.0 if stack_anchored else BAND_NO_STACK
    return math.sqrt(base**2 + scale**2 + stack**2 + chip_term**2)


def band_for(stack: str, system, chips: int) -> tuple[float, str]:
    """(band, basis) of a plan with `stack` on `system` at `chips`."""
    chip = system.chip
    if chip.status == "local":
        cal = chip.calibration or {}
        if cal.get("effective_tflops"):
            basis = cal.get("basis") or f"calibration of {cal.get('runs', '?')} run(s)"
            return max(BAND_FLOOR, 2 * float(cal.get("rel_error", 0.0))), str(basis)
        return 1.0, "uncalibrated local rate (a guess): calibrate with forge plan --calibrate"
    reps = _package_replays()
    own = [r for r in reps if r.stack == stack]
    pool = own or list(reps)
    anchored_chips = {r.chip for r in reps}
    max_chips = max((r.chips for r in pool), default=1)
    if chip.key in anchored_chips:
        chip_term, basis = 0.0, f"{len(pool)} anchor(s) of the {stack if own else 'other'} stack(s)"
    elif chip.status == "projection":
        chip_term, basis = BAND_PROJECTION, f"projection: {chip.name} is announced, no run anchors it"
    else:
        chip_term, basis = BAND_UNANCHORED_CHIP, f"projection: no published training run on {chip.name} anchors it"
    if chips > 4 * max_chips:
        basis += f"; {chips} chips is past 4x the largest anchored run ({max_chips})"
    return error_band([r.ratio for r in pool], chips, max_chips, bool(own), chip_term), basis


def format_replays(reps: list[Replay]) -> str:
    head = (f"{'anchor':<44}{'stack':<13}{'chips':>6}  {'published':>11}  {'predicted':>11}  "
            f"{'unit':<22}{'step s pub/pred':>17}  {'ratio':>6}  layout")
    lines = [head]
    for r in reps:
        if r.reason:
            lines.append(f"{r.name:<44}{r.stack:<13}{r.chips:>6}  {r.published:>11.4g}  {'n/a':>11}  "
                         f"{r.unit:<22}{r.published_s:>8.3g}/{'-':<8}  {'-':>6}  {r.reason[:80]}")
            continue
        lines.append(f"{r.name:<44}{r.stack:<13}{r.chips:>6}  {r.published:>11.4g}  {r.predicted:>11.4g}  "
                     f"{r.unit:<22}{r.published_s:>8.3g}/{r.predicted_s:<8.3g}  {r.ratio:>6.2f}  {r.layout}"
                     + (f"  [known miss: {r.known_miss}]" if r.known_miss else ""))
    ok = [r.ratio for r in reps if not r.reason]
    if ok:
        lines.append(f"median ratio {statistics.median(ok):.3f}; within +-10%: "
                     f"{sum(abs(x - 1) <= 0.10 for x in ok)}/{len(reps)}; within +-20%: "
                     f"{sum(abs(x - 1) <= 0.20 for x in ok)}/{len(reps)}")
    return "\n".join(lines) + "\n"


def anchor_chip(anchor: dict, catalog: dict) -> str:
    return catalog["systems"][resolve_name(anchor["target"], catalog)]["chip"]
