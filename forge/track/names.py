"""forge's figures as MLflow shows them: metric names grouped in chart sections, single figures as
a person reads them, params flattened, the params whose new value a run could not keep; and
MLflow's limits on params and batches. No MLflow import."""
from __future__ import annotations

import json
import re
from typing import Any, Callable

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (MLflow 3)
MAX_PARAM_KEY = 250
MAX_EXPERIMENT_TAG_VALUE = 20000  # mlflow.utils.validation.MAX_EXPERIMENT_TAG_VAL_LENGTH (the shared view's JSON)
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
METRICS_EVERY_S = 2.0  # metric rows are sent together this often (forge.track.tracker.log_metrics)


# forge's internal metric keys -> the names MLflow shows; a "/" makes MLflow's chart page group a
# section by prefix (train/, eval/, data/, system/), so a run opens on its curves in this order;
# the training curves of every stage kind: pretrain/midtrain, sft (target_tokens, epoch), dpo
# (rewards/chosen, rewards/margin, ...), rft (reward_mean, reward.<function>.mean, kl, ...)
_METRIC_NAMES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"(loss|lr|tokens_per_s|tflops_per_chip|mfu|grad_norm|tokens|target_tokens|epoch|completion_length|clip_fraction|kl"
                r"|reward_mean|reward_std)"), r"train/\1"),
    (re.compile(r"(tokens|repeats)\.(.+)"), r"train/\1/\2"),
    (re.compile(r"rewards/(.+)"), r"train/rewards/\1"),
    (re.compile(r"reward\.(.+)\.(mean|std)"), r"train/reward/\1/\2"),
    (re.compile(r"eval_(.+)"), r"eval/\1"),
    (re.compile(r"eval\.(.+)\.(loss|ppl)"), r"eval/\1/\2"),
    (re.compile(r"hygiene\.(.+)"), lambda m: "data/hygiene/" + m.group(1).replace(".", "/")),
]


def metric_name(key: str) -> str:
    """The MLflow name of one of forge's metric keys (`tokens.domain` -> `train/tokens/domain`);
    keys outside the table (and names already holding a "/", like system/...) are kept."""
    for pattern, name in _METRIC_NAMES:
        m = pattern.fullmatch(key)
        if m:
            return m.expand(name) if isinstance(name, str) else name(m)
    return key


def summary_value(v: Any) -> str:
    """A single figure as a person reads it: 4 significant digits, thousands separated."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) or float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}" if abs(v) >= 1e-3 else f"{v:.3e}"


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{'optim': {'lr': 1e-4}} -> {'optim.lr': '0.0001'}; lists are indexed: stages.0.name."""
    out: dict[str, str] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(tree, (list, tuple)) and any(isinstance(v, (dict, list)) for v in tree):
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
    else:
        out[prefix] = json.dumps(tree) if isinstance(tree, (list, tuple)) else str(tree)
    return out


KEPT_TAG = "forge.params_kept"  # params a run kept with their earlier value ("name: old (now new); ...")


def param_conflicts(existing: dict[str, str], new: dict[str, str]) -> list[str]:
    """'name: old (now new)' for each param in both whose value differs (as MLflow stores it:
    keys and values cut to MLflow's lengths)."""
    out = []
    for key, value in new.items():
        k, v = key[:MAX_PARAM_KEY], str(value)[:MAX_PARAM_VALUE]
        if k in existing and existing[k] != v:
            out.append(f"{k}: {existing[k]} (now {v})")
    return out
