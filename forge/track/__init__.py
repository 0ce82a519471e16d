"""The one place that talks to MLflow (only this package imports it), and what forge records there.

    protocol.py  the Tracker and StageTracker protocols stages and the pipeline are typed with
                 (no MLflow import)
    tracker.py   MlflowTracker: runs (a parent per pipeline, a child per stage), params, metrics,
                 summaries, descriptions, datasets, artifacts; store faults (fail or buffer)
    runs.py      the output folder's run ids (tracking.json) and the pipeline's parent run
    notes.py     the Markdown a run page, a stage's run and a registered version show (plain text)
    names.py     metric names in chart sections (train/, eval/, data/, system/), single figures
                 as text, flattened params, MLflow's limits: the one place a metric, param or tag
                 name is made one MLflow takes (mlflow_key; no MLflow import)
    sending.py   metric rows held back and sent together; a batch the store refused is an error
    store.py     the SQLite store created whole and checked; a server reached without retries
    registry.py  registering a Novella, aliases, a handful of version tags (the rest in one JSON
                 artifact), descriptions
    view.py      links in MLflow 3's model-training layout, the experiment kind, forge's shared view
                 of the runs table (what MLflow's UI allows from outside, and what it does not)
    experiment.py  the experiment created with its kind; its view refreshed when a parent run ends
    story.py     the parent run's headline figures as metrics and the comparison as an HTML table
    export.py    what `forge export` / `forge deploy` read from and record in MLflow

Store faults: a SQLite store is created in a temporary file and linked into place whole (a kill
never leaves half a schema), and an existing one is checked before use (damaged, half-built,
another schema, locked: a forge error naming it, at once, not after MLflow's minute of retries).
"""

import os

# MLflow's usage telemetry: nothing leaves the machine from forge, and its background thread sets and
# unsets an environment variable that other threads then read (seen as a KeyError mid-run)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# MLflow prints a run's and experiment's links when a run on a tracking server ends; they open the
# GenAI layout: forge prints the parent run's own (forge.track.experiment)
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

from forge.track.export import fetch_registered_model, find_novella_run, log_export, registered_versions_of_run
from forge.track.names import (
    MAX_PARAM_KEY,
    MAX_PARAM_VALUE,
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    flatten,
    metric_name,
    summary_value,
)
from forge.track.protocol import StageTracker, Tracker
from forge.track.registry import details_path, version_details
from forge.track.runs import ParentRun, RunIds, parent_run
from forge.track.store import prepare_sqlite_store, quiet_mlflow
from forge.track.tracker import MlflowTracker, null_tracker

__all__ = ["MAX_PARAM_KEY", "MAX_PARAM_VALUE", "METRICS_PER_BATCH", "PARAMS_PER_BATCH",
           "MlflowTracker", "ParentRun", "RunIds", "StageTracker", "Tracker", "details_path", "fetch_registered_model",
           "find_novella_run", "flatten", "log_export", "metric_name", "null_tracker", "parent_run",
           "prepare_sqlite_store", "quiet_mlflow", "registered_versions_of_run", "summary_value", "version_details"]
