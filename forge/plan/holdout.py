"""Leave-one-out check of the planner (`forge plan --anchors --leave-one-out`): the figures fitted on
the anchors (anchors.yaml `fits:`) are refitted without each anchor in turn, and that anchor is
predicted from the refit; the error per anchor says how the planner does out of sample.

The fit minimises the sum of squared log step-time ratios (predicted / published) over the anchors
a group of figures acts on, one figure at a time (golden-section search within its bounds, sweeps
until nothing moves). Only the figures connected to the held-out anchor through shared anchors are
refitted: the rest cannot change its prediction. A figure no remaining anchor identifies takes its
stated prior (`same_as` another fitted figure), else the anchor has no out-of-sample prediction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from forge.plan import search
from forge.plan.anchors import (
    ANCHORS_FILE,
    FAST,
    anchor_catalog,
    anchor_chip,
    anchor_model,
    anchor_workload,
    load_anchors,
    package_catalog,
    published_step_seconds,
)
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import get_system
from forge.plan.model import spec_from_config
from forge.plan.stacks import load_stacks

GOLDEN = (math.sqrt(5) - 1) / 2
TOLERANCE = 4e-3        # of a figure's bounds: where the search stops
MAX_SWEEPS = 6
WITHIN = 0.20           # the target: every anchor within +-20% out of sample
MISS = 10.0             # the squared-log penalty of a layout that does not fit


@dataclass(frozen=True)
class Figure:
    """One fitted figure: where it lives, which anchors it acts on, its bounds and prior."""

    name: str
    at: tuple
    acts_on: dict
    bounds: tuple[float, float]
    prior: str = ""            # the name of the figure it takes when unidentified
    prior_why: str = ""


@dataclass(frozen=True)
class Holdout:
    """One anchor predicted from a fit that did not see it."""

    name: str
    in_sample: float           # predicted / published step time with the catalog's figures
    out_of_sample: float       # the same, from the refit without this anchor (nan: no prediction)
    refit: dict                # the figures the refit changed, by name
    basis: str = ""            # a prior used, or why there is no prediction

    @property
    def error(self) -> float:
        """Relative error of the out-of-sample step time (predicted / published - 1)."""
        return self.out_of_sample - 1

    @property
    def within(self) -> bool:
        return math.isfinite(self.out_of_sample) and abs(self.out_of_sample - 1) <= WITHIN


def load_figures(path: str | Path = ANCHORS_FILE) -> list[Figure]:
    rows = (yaml.load(Path(path).read_text(), Loader=FAST) or {}).get("fits", [])
    return [Figure(r["name"], tuple(r["at"]), dict(r["acts_on"]), (float(r["bounds"][0]), float(r["bounds"][1])),
                   str((r.get("prior") or {}).get("same_as", "")), str((r.get("prior") or {}).get("why", "")))
            for r in rows]


def _get(tree: dict, at: tuple) -> float:
    for key in at:
        tree = tree[key]
    return float(tree)  # type: ignore[arg-type]


def _with(tree: dict, at: tuple, value: float) -> dict:
    """`tree` with the leaf at `at` set to `value`, copying only the dicts along the path."""
    out = dict(tree)
    out[at[0]] = value if len(at) == 1 else _with(tree.get(at[0], {}), at[1:], value)
    return out


class Fitter:
    """Replays anchors under trial values of the fitted figures (memoised per anchor and values)."""

    def __init__(self, anchors: list[dict], figures: list[Figure], catalog: dict | None = None):
        self.anchors = {a["name"]: a for a in anchors}
        self.figures = {f.name: f for f in figures}
        self.catalog = catalog if catalog is not None else package_catalog()
        self.stacks = load_stacks()
        self.base = {f.name: self._current(f) for f in figures}
        self.acts = {f.name: {n for n, a in self.anchors.items() if self._acts(f, a)} for f in figures}
        self.memo: dict[tuple, float] = {}
        self.specs = {n: spec_from_config(anchor_model(a)) for n, a in self.anchors.items()}

    def _current(self, f: Figure) -> float:
        return _get(self.stacks, f.at[1:]) if f.at[0] == "stacks" else _get(self.catalog, f.at)

    def _acts(self, f: Figure, anchor: dict) -> bool:
        have = {"chip": anchor_chip(anchor, self.catalog), "target": anchor["target"],
                "precision": anchor["precision"], "stack": anchor["stack"]}
        return all(have.get(k) == v for k, v in f.acts_on.items())

    def ratio(self, name: str, values: dict) -> float:
        """Predicted / published step time of anchor `name` with `values` over the catalog's figures."""
        mine = tuple(sorted((k, round(v, 6)) for k, v in values.items() if name in self.acts[k]))
        key = (name, mine)
        if key not in self.memo:
            self.memo[key] = self._replay(self.anchors[name], dict(mine))
        return self.memo[key]

    def _replay(self, anchor: dict, values: dict) -> float:
        cat, stack_over = self.catalog, {}
        for fname, value in values.items():
            at = self.figures[fname].at
            if at[0] == "stacks":
                stack_over[at[-1]] = value
            else:
                cat = _with(cat, at, value)
        cat = anchor_catalog(anchor, cat)
        spec = self.specs[anchor["name"]]
        ctx = search.Context.build(spec, anchor_workload(anchor), get_system(anchor["target"], cat), None, True,
                                   anchor["stack"])
        if stack_over and ctx.stack is not None:
            ctx = replace(ctx, stack=replace(ctx.stack, **stack_over))
        best = search.best_layout(ctx, anchor["chips"], dict(anchor.get("layout") or {}))
        if best is None:
            return math.inf
        return best.step.total / published_step_seconds(anchor, training_flops_per_token(spec, anchor["seq_len"]))

    def loss(self, names: set[str], values: dict) -> float:
        total = 0.0
        for n in names:
            r = self.ratio(n, values)
            total += math.log(r) ** 2 if math.isfinite(r) and r > 0 else MISS
        return total

    def component(self, start: set[str]) -> tuple[set[str], set[str]]:
        """(figures, anchors) connected to the anchors `start` through figures that act on shared anchors."""
        figs, names, grew = set(), set(start), True
        while grew:
            new_figs = {f for f, acted in self.acts.items() if acted & names}
            new_names = set().union(*(self.acts[f] for f in new_figs)) | names if new_figs else names
            grew = new_figs != figs or new_names != names
            figs, names = new_figs, new_names
        return figs, names

    def fit(self, figs: set[str], names: set[str]) -> dict:
        """The values of `figs` that minimise the loss over anchors `names` (the others at the catalog's)."""
        values = {f: self.base[f] for f in figs}
        for _ in range(MAX_SWEEPS):
            moved = 0.0
            for f in sorted(figs):
                lo, hi = self.figures[f].bounds
                best = _golden(lambda x, f=f: self.loss(names & self.acts[f], {**values, f: x}), lo, hi)
                moved = max(moved, abs(best - values[f]) / (hi - lo))
                values[f] = best
            if moved < TOLERANCE:
                break
        return values


def _golden(fn, lo: float, hi: float) -> float:
    """The minimum of a unimodal-enough fn on [lo, hi] by golden-section search."""
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = fn(c), fn(d)
    while b - a > TOLERANCE * (hi - lo):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = fn(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = fn(d)
    return (a + b) / 2


def leave_one_out(anchors: list[dict] | None = None, figures: list[Figure] | None = None,
                  catalog: dict | None = None) -> list[Holdout]:
    """Each anchor predicted from a refit of the figures connected to it, without it."""
    fitter = Fitter(anchors if anchors is not None else load_anchors(),
                    figures if figures is not None else load_figures(), catalog)
    out = []
    for name in fitter.anchors:
        in_sample = fitter.ratio(name, fitter.base)
        figs, names = fitter.component({name})
        values = _refit(fitter, figs, names - {name})
        basis, missing = [], []
        for f in sorted(figs - set(values)):
            prior = fitter.figures[f].prior
            if prior in fitter.figures and fitter.acts[prior] - {name}:
                # the prior's own group of figures, fitted without the held-out anchor too
                others = fitter.component(fitter.acts[prior] - {name})
                values[f] = _refit(fitter, others[0], others[1] - {name}).get(prior, math.nan)
                basis.append(f"{f} from its prior: {fitter.figures[f].prior_why}")
            if not math.isfinite(values.get(f, math.nan)):
                values.pop(f, None)
                missing.append(f)
        if missing and any(name in fitter.acts[f] for f in missing):
            out.append(Holdout(name, in_sample, math.nan, {}, f"no other anchor identifies {', '.join(missing)}"))
            continue
        values = {f: v for f, v in values.items() if name in fitter.acts[f]}
        out.append(Holdout(name, in_sample, fitter.ratio(name, values), values, "; ".join(basis)))
    return out


def _refit(fitter: Fitter, figs: set[str], names: set[str]) -> dict:
    """The figures of `figs` some anchor of `names` identifies, fitted on `names`."""
    return fitter.fit({f for f in figs if fitter.acts[f] & names}, names)


def full_fit(anchors: list[dict] | None = None, figures: list[Figure] | None = None,
             catalog: dict | None = None) -> dict[str, tuple[float, float]]:
    """Each figure refitted on every anchor: (the catalog's value, the refit)."""
    fitter = Fitter(anchors if anchors is not None else load_anchors(),
                    figures if figures is not None else load_figures(), catalog)
    values = fitter.fit(set(fitter.figures), set(fitter.anchors))
    return {f: (fitter.base[f], values[f]) for f in fitter.figures}


def format_holdouts(rows: list[Holdout], fitted: dict[str, tuple[float, float]] | None = None) -> str:
    head = f"{'anchor':<44}{'in-sample':>10}{'held out':>10}{'error':>8}  refit without it / basis"
    lines = [head]
    for h in rows:
        if not math.isfinite(h.out_of_sample):
            lines.append(f"{h.name:<44}{h.in_sample:>10.2f}{'n/a':>10}{'-':>8}  {h.basis}")
            continue
        refit = ", ".join(f"{k} {v:.3g}" for k, v in sorted(h.refit.items()))
        extra = f"; {h.basis}" if h.basis else ""
        mark = "" if h.within else "  MISS"
        lines.append(f"{h.name:<44}{h.in_sample:>10.2f}{h.out_of_sample:>10.2f}{h.error:>+8.0%}  {refit}{extra}{mark}")
    ok = [h for h in rows if h.within]
    missed = [h.name for h in rows if not h.within]
    lines.append(f"ratios and errors are of the step time (predicted / published). Within +-{WITHIN:.0%} "
                 f"out of sample: {len(ok)}/{len(rows)}" + (f"; not: {', '.join(missed)}" if missed else "; all are"))
    if fitted:
        lines.append("figures refitted on every anchor (catalog -> refit): " + ", ".join(
            f"{k} {a:.3g} -> {b:.3g}" for k, (a, b) in fitted.items()))
    return "\n".join(lines) + "\n"
