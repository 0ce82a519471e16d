"""Gates: the recipe's thresholds on the Novella's evaluation (forge.recipe.eval.Gates). Each
check says which gate, on which metric, the value, the limit and by how much it failed."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from forge.recipe.eval import EvalBlock


@dataclass
class GateResult:
    gate: str
    metric: str
    value: float | None       # None: the suite did not measure it (a failure)
    limit: float
    kind: str                 # "min" or "max"
    passed: bool

    @property
    def text(self) -> str:
        bound = "at least" if self.kind == "min" else "at most"
        if self.value is None:
            return f"{self.gate}: {self.metric} was not measured (needs {bound} {self.limit:.4g})"
        verdict = "pass" if self.passed else f"FAIL by {abs(self.value - self.limit):.4g}"
        return f"{self.gate}: {self.metric} = {self.value:.4g}, {bound} {self.limit:.4g}: {verdict}"

    def as_dict(self) -> dict:
        return {**asdict(self), "text": self.text}


def _check(gate: str, metric: str, metrics: dict, limit: float, kind: str) -> GateResult:
    value = metrics.get(metric)
    ok = value is not None and (value >= limit if kind == "min" else value <= limit)
    return GateResult(gate, metric, value, limit, kind, ok)


def check_gates(suite: EvalBlock, metrics: dict[str, float]) -> list[GateResult]:
    """Every gate the recipe sets, on the Novella's metrics (with retention/domain gain computed
    against the starting checkpoint)."""
    g, out = suite.gates, []
    if g.retention_ppl_increase_max is not None:
        for name in suite.general or ["(no general source)"]:
            out.append(_check("retention_ppl_increase_max", f"retention.{name}", metrics,
                              g.retention_ppl_increase_max, "max"))
    if g.domain_ppl_decrease_min is not None:
        for name in suite.domain or ["(no domain source)"]:
            out.append(_check("domain_ppl_decrease_min", f"domain_gain.{name}", metrics,
                              g.domain_ppl_decrease_min, "min"))
    if g.fact_recall_min is not None:
        out += [_check("fact_recall_min", name, metrics, g.fact_recall_min, "min") for name in _recall_metrics(suite, metrics)]
    if g.preference_accuracy_min is not None:
        out.append(_check("preference_accuracy_min", "preference_accuracy", metrics, g.preference_accuracy_min, "min"))
    if g.reward_mean_min is not None:
        out.append(_check("reward_mean_min", "reward.mean", metrics, g.reward_mean_min, "min"))
    out += [_check(f"min.{k}", k, metrics, v, "min") for k, v in g.min.items()]
    out += [_check(f"max.{k}", k, metrics, v, "max") for k, v in g.max.items()]
    return out


def _recall_metrics(suite: EvalBlock, metrics: dict[str, float]) -> list[str]:
    """The fact-recall figures fact_recall_min gates: `fact_recall.<match>`, or with a split_field
    every split's `fact_recall.<split>.<match>`."""
    fr = suite.fact_recall
    match = fr.match if fr else "contains"
    if fr is None or fr.split_field is None:
        return [f"fact_recall.{match}"]
    per_split = sorted(k for k in metrics if k.startswith("fact_recall.") and k.endswith(f".{match}") and k.count(".") == 2)
    return per_split or [f"fact_recall.<{fr.split_field}>.{match}"]


def passed(results: list[GateResult]) -> bool:
    return all(r.passed for r in results)
