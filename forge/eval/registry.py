"""Registry aliases for a Novella: every registered version gets `candidate`; the deployment alias
(`tracking.alias`, default `champion`) moves to it only when its gates pass and it beats the
current holder on the recipe's primary metric, and the version it leaves keeps
`previous-<alias>`. Version tags are clean strings: base, stages, data hashes, compute planned vs
measured, the primary metric and the gate results."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from forge.recipe.eval import higher_is_better
from forge.track.protocol import Tracker
from forge.track.registry import CANDIDATE

PRIMARY_METRIC, PRIMARY_VALUE = "forge.primary_metric", "forge.primary_value"


@dataclass
class Standing:
    """How a new version stands: the recipe's primary metric, its value, and whether the gates passed."""

    metric: str
    value: float | None
    gates_ok: bool


@dataclass
class Decision:
    promote: bool
    reason: str
    previous: int | None = None   # the version that held the alias before (now previous-<alias>)


def decide(metric: str, value: float | None, gates_ok: bool, current: tuple[int, dict] | None) -> Decision:
    """Whether the new version takes the deployment alias from `current` (version, tags)."""
    if not gates_ok:
        return Decision(False, "a gate failed")
    if value is None or not math.isfinite(value):
        return Decision(False, f"the primary metric {metric} was not measured")
    if current is None:
        return Decision(True, "no version held the alias")
    version, tags = current
    if tags.get(PRIMARY_METRIC) != metric:
        return Decision(False, f"version {version} holds the alias, judged on {tags.get(PRIMARY_METRIC) or 'nothing'}, "
                               f"not {metric}: not comparable, set the alias by hand if this one should take it")
    held = float(tags[PRIMARY_VALUE])
    better = value > held if higher_is_better(metric) else value < held
    word = "beats" if better else "does not beat"
    return Decision(better, f"{metric} {value:.4g} {word} version {version}'s {held:.4g}", version if better else None)


def register(tracker: Tracker, model_dir: Path | str, name: str, alias: str, tags: dict[str, str],
             standing: Standing) -> tuple[int | None, Decision]:
    """Register the Novella as `candidate`; promote it to `alias` if the decision says so."""
    metric, value = standing.metric, standing.value
    tags = {**tags, PRIMARY_METRIC: metric, PRIMARY_VALUE: "" if value is None else repr(float(value))}
    if alias == CANDIDATE:  # the pre-gates behaviour, asked for explicitly: every run takes it
        return tracker.register_model(model_dir, name, CANDIDATE, tags), Decision(True, "alias is candidate")
    current = tracker.alias_version(name, alias)
    version = tracker.register_model(model_dir, name, CANDIDATE, tags)
    decision = decide(metric, value, standing.gates_ok, current)
    if version is not None and decision.promote:
        if current is not None:
            tracker.set_alias(name, f"previous-{alias}", current[0])
        tracker.set_alias(name, alias, version)
    if version is not None:
        tracker.set_version_tags(name, version, {f"forge.{alias}": "yes" if decision.promote else "no",
                                                 "forge.alias_decision": decision.reason})
    return version, decision
