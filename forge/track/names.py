"""forge's figures as MLflow shows them: metric names grouped in chart sections, single figures as
a person reads them, params flattened, the params whose new value a run could not keep; and
MLflow's limits on names, params and batches (`mlflow_key`: the one place a metric, param or tag
name is made one MLflow takes). No MLflow import."""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any, Callable

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (MLflow 3)
MAX_NAME = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH: metric names, param and tag keys
MAX_PARAM_KEY = MAX_NAME
MAX_EXPERIMENT_TAG_VALUE = 20000  # mlflow.utils.validation.MAX_EXPERIMENT_TAG_VAL_LENGTH (the shared view's JSON)
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
METRICS_EVERY_S = 2.0  # metric rows are sent together this often (forge.track.sending)


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


# the characters MLflow takes in a metric, param or tag name (mlflow.utils.validation,
# validate_param_and_metric_name, POSIX): word characters, "/", ".", "-", " " and ":"
_REFUSED = re.compile(r"[^/\w.\- :]")
_HASH = 8  # hex digits of the full name's SHA-256 that keep two changed names apart


def mlflow_key(name: str) -> str:
    """`name` as MLflow takes it, for a metric, a param or a tag: a name MLflow refuses (over
    MAX_NAME characters, a character outside its set, a path that would resolve to another name:
    "/a", "a//b", "a/../b") is made valid and ends with "-" and a hash of the full name, so the
    same name always gives the same key and two names never share one. The tracker keeps the full
    names of changed keys in the run's names.json."""
    if len(name) <= MAX_NAME and not _REFUSED.search(name) and _unique_path(name):
        return name
    parts = [_REFUSED.sub("_", p) for p in name.split("/")]
    text = "/".join(p if p not in ("", ".", "..") else "_" for p in parts)
    text = "_" + text if text.startswith("..") else text  # "..a" reads as a parent folder to MLflow
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH]
    return f"{text[:MAX_NAME - _HASH - 1]}-{digest}"


class Keys:
    """The MLflow keys of forge's names (mlflow_key), and the full names of the ones it changed,
    per run, for the run's names.json; `unsaved` hands out those with new entries once."""

    def __init__(self) -> None:
        self._changed: dict[str, dict[str, str]] = {}  # run id -> MLflow key -> full name
        self._new: set[str] = set()

    def key(self, run_id: str, name: str) -> str:
        key = mlflow_key(name)
        if key != name and self._changed.setdefault(run_id, {}).get(key) != name:
            self._changed[run_id][key] = name
            self._new.add(run_id)
        return key

    def unsaved(self) -> dict[str, dict[str, str]]:
        """Run id -> its whole key -> full name table, for each run with entries not handed out yet."""
        out = {run_id: dict(self._changed[run_id]) for run_id in sorted(self._new)}
        self._new.clear()
        return out


def saved_names(mlflow: Any, run_id: str) -> dict[str, str]:
    """The run's names.json as an earlier process wrote it ({} if there is none), so that a resumed
    run's table keeps the names only the earlier process logged."""
    try:
        saved = mlflow.artifacts.load_dict(f"runs:/{run_id}/names.json")
    except Exception:  # no such artifact yet: MLflow raises its own errors for a missing file
        return {}
    return {str(k): str(v) for k, v in saved.items()} if isinstance(saved, dict) else {}


def _unique_path(name: str) -> bool:
    """MLflow may store a name as a file path: it must not resolve to another name (its path_not_unique)."""
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith(("..", "/"))


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
    keys made valid by mlflow_key, values cut to MLflow's length)."""
    out = []
    for key, value in new.items():
        k, v = mlflow_key(key), str(value)[:MAX_PARAM_VALUE]
        if k in existing and existing[k] != v:
            out.append(f"{k}: {existing[k]} (now {v})")
    return out
