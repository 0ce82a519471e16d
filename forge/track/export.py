"""What `forge export` and `forge deploy` read from and record in MLflow: a registered Novella
downloaded as one Hugging Face folder, the run that wrote a Novella, and the export's records on
that run and its registry versions."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.lineage import Lineage
from forge.scrub import scrub, scrub_dict


def fetch_registered_model(model_uri: str, tracking_uri: str, dest: str | os.PathLike[str]) -> dict[str, Any]:
    """Download a registered Novella (`models:/name@alias` or `models:/name/version`) into `dest`
    as one Hugging Face folder (weights, config, tokenizer, and lineage.json: the version's own
    where it was registered with one, else its run's).
    Returns {'folder', 'name', 'version', 'run_id'}."""
    import mlflow
    from mlflow.exceptions import MlflowException

    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    ref = model_uri.removeprefix("models:/")
    name, sep, alias = ref.partition("@")
    try:
        if sep:
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, _, number = ref.partition("/")
            mv = client.get_model_version(name, number)
        raw = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(Path(dest) / "mlflow")))
    except MlflowException as e:
        raise ForgeError(f"{model_uri}: not found in {tracking_uri}: {e.message.splitlines()[0]}") from None
    folder = Path(dest) / "model"
    folder.mkdir(parents=True, exist_ok=True)
    for part in (raw / "model", raw / "components" / "tokenizer"):  # mlflow.transformers' layout
        for f in part.iterdir() if part.is_dir() else []:
            os.replace(f, folder / f.name)
    if (raw / "lineage.json").is_file():  # the version's own (a served checkpoint's: its run registers several)
        os.replace(raw / "lineage.json", folder / "lineage.json")
    elif mv.run_id:
        try:
            mlflow.artifacts.download_artifacts(run_id=mv.run_id, artifact_path="lineage.json", dst_path=str(folder))
        except MlflowException:
            pass  # a model registered outside a forge pipeline has no lineage
    return {"folder": folder, "name": mv.name, "version": str(mv.version), "run_id": mv.run_id}


def registered_versions_of_run(run_id: str, tracking_uri: str) -> list[tuple[str, str]]:
    """(name, version) of every registry version made from `run_id`."""
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    try:
        client.get_run(run_id)
    except MlflowException:
        raise ForgeError(f"run {run_id}: no such MLflow run in {tracking_uri}") from None
    return [(v.name, str(v.version)) for v in client.search_model_versions(f"run_id = '{run_id}'")]


def find_novella_run(tracking_uri: str, lineage: Lineage) -> str | None:
    """The pipeline run that wrote a Novella: its logged lineage.json equals the folder's."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    filter_ = f"tags.`forge.pipeline` = 'novella' and tags.`forge.recipe` = '{lineage.name}'"
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], filter_, max_results=50):
            with tempfile.TemporaryDirectory() as tmp, contextlib.suppress(Exception):
                path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="lineage.json",
                                                           dst_path=tmp)
                logged = json.loads(Path(path).read_text())
                if logged.get("created") == lineage.created and logged.get("base") == lineage.base.model_dump():
                    return str(run.info.run_id)
    return None


def log_export(tracking_uri: str, run_id: str, files: dict[str, dict[str, Any]], exported_uri: str) -> list[str]:
    """Log an export's manifest/job request (`files`: artifact name -> dict) on the Novella's run,
    tag the run and each registry version made from it with `exported_uri`; return 'name/version's.
    What it writes passes forge.scrub, as everything the tracker writes does."""
    import mlflow

    exported_uri = scrub(exported_uri)
    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    for artifact, data in files.items():
        client.log_dict(run_id, scrub_dict(data), f"export/{artifact}")
    client.set_tag(run_id, "forge.exported_uri", exported_uri)
    tagged = []
    for v in client.search_model_versions(f"run_id = '{run_id}'"):
        client.set_model_version_tag(v.name, str(v.version), "exported_uri", exported_uri)
        tagged.append(f"{v.name}/{v.version}")
    return tagged
