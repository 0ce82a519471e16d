"""How forge's runs open in the MLflow UI (3.x): links in the model-training layout, the experiment
kind, and the experiment's shared view that forge links to (every run a row, oldest first, the
headline figures as columns). Plain strings and JSON; no MLflow import.

What MLflow 3.17's UI allows from outside, as read from its server bundle:
  - layout: the URL parameter `workflowType=machine_learning` (else the browser's remembered
    choice, GenAI by default); the experiment tag `mlflow.experimentKind` is read only where a
    workspace feature flag is off (Databricks), so forge sets it for those and links with the parameter
  - the runs table: a shared view, an experiment tag `mlflow.sharedViewState.<key>` opened with
    `viewStateShareKey=<key>` (what the page's Share button writes): search, sort, selected columns,
    their order and widths; not which parent rows are expanded (MLflow leaves that out of shared
    views). The table nests child runs under a collapsed parent only when sorted by its default
    key (`attributes.start_time`); the view sorts by `attributes.`Created`` ascending (the same
    time, oldest first), so the parent and each stage are a row of their own, in the order they ran
  - the Assistant panel: no server flag, variable or setting turns it off; it offers itself when
    the UI is opened on localhost and opens by itself on a browser's first visit
"""
from __future__ import annotations

import json
from typing import Any

from forge.track.names import MAX_EXPERIMENT_TAG_VALUE

MODEL_TRAINING = "workflowType=machine_learning"  # MLflow 3 opens experiments and runs in its GenAI layout otherwise
EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"
VIEW_KEY = "forge"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
ORDER_BY = "attributes.`Created`"  # start time, under a name the table does not nest children for
# a stage's headline figure by kind (MLflow names, forge.track.names): eval loss (pretrain, sft, ...),
# preference accuracy (dpo), mean reward (rft); the table shows each run's latest value
STAGE_HEADLINES = ("eval/loss", "eval/rewards/accuracy", "train/reward_mean")
COLUMN_WIDTH = 170  # pixels: "novella/retention.general" fits
MAX_COLUMNS = 40     # a wider table only scrolls; the shared view's JSON stays far below MLflow's limit
ASSISTANT_NOTE = ("MLflow's Assistant panel opens by itself on a browser's first visit (MLflow has no setting "
                  "to keep it off): close it once and it stays closed")


def experiment_url(base: str, experiment_id: str | None = None, view: bool = False) -> str:
    """The experiment's runs (with `view`: in forge's shared view), or the experiments list."""
    if experiment_id is None:
        return f"{base}/#/experiments?{MODEL_TRAINING}"
    query = f"{MODEL_TRAINING}&viewStateShareKey={VIEW_KEY}" if view else MODEL_TRAINING
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING}"


def story_metrics(evaluation: Any) -> dict[str, float]:
    """The headline figures a pipeline's parent run carries as metrics: `<label>/<metric>` for the
    comparison's baseline (`start`) and its last model (the Novella), from the lineage's
    EvaluationRecord (or its dict); 5 significant digits, as the runs table shows a value whole."""
    record = evaluation if isinstance(evaluation, dict) else evaluation.model_dump() if evaluation is not None else {}
    models = record.get("models") or []
    picked = [models[0], models[-1]] if len(models) > 1 else models
    return {f"{m['label']}/{name}": float(f"{value:.5g}") for m in picked for name, value in m.get("metrics", {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def headline_columns(parent: dict[str, float], stage_keys: set[str]) -> list[str]:
    """The metric columns of forge's view, in order: the stages' headline figures present, then the
    parent's figures, baseline and Novella side by side per metric; a `loss.<s>` is left out where
    `ppl.<s>` is there, and a baseline figure that is 0 (a change measured against itself) too."""
    columns = [k for k in STAGE_HEADLINES if k in stage_keys]
    labels = list(dict.fromkeys(k.split("/", 1)[0] for k in parent))
    names = list(dict.fromkeys(k.split("/", 1)[1] for k in parent))
    for name in names:
        if name.startswith("loss.") and "ppl." + name.removeprefix("loss.") in names:
            continue
        columns += [f"{label}/{name}" for label in labels
                    if f"{label}/{name}" in parent and not (label != labels[-1] and parent[f"{label}/{name}"] == 0)]
    return columns


def view_state(metric_columns: list[str]) -> str:
    """The shared view's JSON (MLflow's experiment-page state: search facets and table state), its
    columns cut to fit MLflow's longest experiment tag."""
    keep = metric_columns[:MAX_COLUMNS]
    while True:
        columns = [f"metrics.`{k}`" for k in keep] + ["attributes.`Models`"]
        text = json.dumps({"searchFilter": "", "orderByKey": ORDER_BY, "orderByAsc": True, "startTime": "ALL",
                           "lifecycleFilter": "Active", "selectedColumns": columns, "columnOrder": columns,
                           "columnWidths": {c: COLUMN_WIDTH for c in columns[:-1]}})
        if len(text) <= MAX_EXPERIMENT_TAG_VALUE or not keep:
            return text
        keep = keep[:-1]
