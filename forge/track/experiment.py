"""The experiment forge tracks to, through MLflow: created (or adopted) with its kind, and its shared
view (forge.track.view) refreshed when a top-level run with stages ends, with the run's link in
the model-training layout printed for a tracking server (MLflow's own links open the GenAI one)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from forge.scrub import first_line
from forge.track.view import EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT, VIEW_TAG, headline_columns, run_url, view_state

MAX_RUNS = 200  # the stages of one pipeline; more are not read for the view


def use_experiment(mlflow: Any, name: str, artifact_dir: str | None) -> None:
    """Create the experiment (artifacts in `artifact_dir`) as a model-development one, or adopt an
    existing one, giving it that kind when it has none (a kind someone chose stays); make it active."""
    found = mlflow.get_experiment_by_name(name)
    if found is None:
        location = Path(artifact_dir).resolve().as_uri() if artifact_dir else None
        mlflow.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: MODEL_DEVELOPMENT})
    elif EXPERIMENT_KIND_TAG not in found.tags:
        mlflow.MlflowClient().set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
    mlflow.set_experiment(name)


def story_view(client: Any, run_id: str) -> list[str] | None:
    """The view's metric columns for a top-level run and its child runs (None: no child runs, so
    not a pipeline's parent: the view is left as it is)."""
    run = client.get_run(run_id)
    children = client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'",
                                  max_results=MAX_RUNS)
    if not children:
        return None
    stage_keys = {k for c in children for k in c.data.metrics}
    story = {k: v for k, v in run.data.metrics.items() if "/" in k and not k.startswith(("train/", "eval/", "system/"))}
    return headline_columns(story, stage_keys)


def after_run(mlflow: Any, run_id: str, uri: str) -> None:
    """A top-level run has ended: refresh the experiment's view from it, and for a tracking server
    print where its page is. A failure here only loses the view: it is said, never raised."""
    try:
        client = mlflow.MlflowClient()
        columns = story_view(client, run_id)
        experiment_id = client.get_run(run_id).info.experiment_id
        if columns is not None:
            client.set_experiment_tag(experiment_id, VIEW_TAG, view_state(columns))
        if uri.startswith(("http://", "https://")):
            print(f"forge: MLflow run page: {run_url(uri.rstrip('/'), experiment_id, run_id)}", flush=True)
    except Exception as e:  # the store failed after the run ended: the records are in, the view is not
        print(f"forge: note: could not update the MLflow view of run {run_id}: {first_line(e, 200)}",
              file=sys.stderr)
