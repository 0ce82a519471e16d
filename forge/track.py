"""The one place that talks to MLflow.

A Tracker owns forge's runs (one parent per pipeline, a nested child per stage) and hides
MLflow's limits: params are flattened, truncated to MLflow's value length and sent in batches;
only rank 0 logs (other ranks get a Tracker with `enabled=False`, which does nothing). A run left
by an exception is ended FAILED with the error message, so nothing stays RUNNING.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (MLflow 3)
MAX_PARAM_KEY = 250
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000


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


class Tracker:
    """Runs, params, metrics, datasets, artifacts and the model registry, through MLflow."""

    def __init__(self, uri: str, experiment: str, enabled: bool = True, artifact_dir: str | None = None):
        """`artifact_dir`: where a new experiment keeps artifacts (default: beside a SQLite store)."""
        self.enabled, self.uri, self.experiment = enabled, uri, experiment
        if not enabled:
            return
        import mlflow

        self._mlflow = mlflow
        if uri.startswith("sqlite:///") and artifact_dir is None:
            db = Path(uri.removeprefix("sqlite:///"))
            db.parent.mkdir(parents=True, exist_ok=True)
            artifact_dir = str(db.parent / "mlartifacts")
        mlflow.set_tracking_uri(uri)
        if mlflow.get_experiment_by_name(experiment) is None:
            location = Path(artifact_dir).resolve().as_uri() if artifact_dir else None
            mlflow.create_experiment(experiment, artifact_location=location)
        mlflow.set_experiment(experiment)

    # ---------------------------------------------------------------------------- runs
    @contextlib.contextmanager
    def run(self, name: str, tags: dict[str, str] | None = None, run_id: str | None = None) -> Iterator[str | None]:
        """A run (nested under the active one, if any); FAILED with the message if the body raises,
        KILLED if it was interrupted. `run_id`: reopen that run (a resumed stage continues its
        own run, its metrics continuing from the step it stopped at)."""
        if not self.enabled:
            yield None
            return
        mlflow = self._mlflow
        nested = mlflow.active_run() is not None
        if run_id is not None:
            run = mlflow.start_run(run_id=run_id, nested=nested)
            if tags:
                mlflow.set_tags(tags)
        else:
            run = mlflow.start_run(run_name=name, nested=nested, tags=tags)
        status = "FINISHED"
        try:
            yield run.info.run_id
        except BaseException as e:
            stopped = isinstance(e, KeyboardInterrupt) or getattr(e, "stopped_on_request", False)
            status = "KILLED" if stopped else "FAILED"
            message = f"{type(e).__name__}: {e}" if not str(e).startswith(type(e).__name__) else str(e)
            if isinstance(e, SystemExit):
                message = f"stopped with exit status {e.code} (terminated, or another process of the launch failed)"
            with contextlib.suppress(Exception):
                mlflow.set_tags({"error": message[:5000], "mlflow.note.content": f"Failed: {message[:5000]}"})
            raise
        finally:
            # the run always ends, whatever else fails here: nothing is left RUNNING
            try:
                mlflow.flush_async_logging()
            finally:
                mlflow.end_run(status)

    def run_status(self, run_id: str) -> str | None:
        """'RUNNING', 'FINISHED', 'FAILED' or 'KILLED'; None if the store has no such run."""
        if not self.enabled:
            return None
        try:
            return self._mlflow.MlflowClient().get_run(run_id).info.status
        except self._mlflow.exceptions.MlflowException:
            return None

    def end_stale(self, run_id: str, message: str) -> None:
        """Mark a run that a killed process left RUNNING as FAILED, saying why."""
        if not self.enabled:
            return
        client = self._mlflow.MlflowClient()
        client.set_tag(run_id, "error", message[:5000])
        client.set_tag(run_id, "mlflow.note.content", f"Failed: {message[:5000]}")
        client.set_terminated(run_id, "FAILED")

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.enabled:
            self._mlflow.set_tags({k: str(v)[:5000] for k, v in tags.items()})

    # ------------------------------------------------------------------- params, metrics
    def log_params(self, params: dict[str, Any]) -> None:
        if not self.enabled:
            return
        flat = {k[:MAX_PARAM_KEY]: v[:MAX_PARAM_VALUE] for k, v in flatten(params).items()}
        items = list(flat.items())
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self._mlflow.log_params(dict(items[i:i + PARAMS_PER_BATCH]))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self.enabled or not metrics:
            return
        items = [(k, float(v)) for k, v in metrics.items()]
        for i in range(0, len(items), METRICS_PER_BATCH):
            # asynchronous: a training step never waits on the store; flushed when the run ends
            self._mlflow.log_metrics(dict(items[i:i + METRICS_PER_BATCH]), step=step, synchronous=False)

    # ------------------------------------------------------------------ data, artifacts
    def log_dataset(self, name: str, path: str, digest: str, context: str = "train",
                    tags: dict[str, str] | None = None) -> None:
        """Record a data source as an MLflow dataset input (name, where it lives, content hash)."""
        if not self.enabled:
            return
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are local files
            warnings.simplefilter("ignore")
            source = resolve_dataset_source(path)
        dataset = MetaDataset(source, name=name, digest=digest[:32])
        self._mlflow.log_input(dataset, context=context, tags=tags)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.enabled:
            self._mlflow.log_text(text, artifact_file)

    def log_dict(self, data: dict, artifact_file: str) -> None:
        if self.enabled:
            self._mlflow.log_dict(data, artifact_file)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if self.enabled:
            self._mlflow.log_artifact(str(path), artifact_path)

    def log_bytes(self, data: bytes, artifact_file: str) -> None:
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(artifact_file).name
            p.write_bytes(data)
            parent = str(Path(artifact_file).parent)
            self._mlflow.log_artifact(str(p), None if parent == "." else parent)

    # ---------------------------------------------------------------------- registry
    def register_model(self, model_dir: str | os.PathLike, name: str, alias: str,
                       tags: dict[str, str]) -> int | None:
        """Log a Hugging Face checkpoint as an MLflow transformers model, register it, set the alias."""
        if not self.enabled:
            return None
        import mlflow.transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        os.environ["HF_HUB_OFFLINE"] = "1"  # MLflow looks up a model card on the hub; a local model has none
        logging.getLogger("mlflow.transformers").setLevel(logging.ERROR)  # ...and warns that it found none
        info = mlflow.transformers.log_model(
            {"model": model, "tokenizer": tokenizer}, name="novella", task="text-generation",
            registered_model_name=name, tags=tags, pip_requirements=_requirements(),
        )
        version = int(info.registered_model_version)
        client = mlflow.MlflowClient()
        client.set_registered_model_alias(name, alias, str(version))
        for k, v in tags.items():
            client.set_model_version_tag(name, str(version), k, str(v)[:5000])
        return version

    def log_table(self, table: dict[str, list], artifact_file: str) -> None:
        """A table (column -> values) as an MLflow table artifact (JSON), e.g. sample generations."""
        if self.enabled:
            self._mlflow.log_table(data=table, artifact_file=artifact_file)


def _requirements() -> list[str]:
    """Pinned runtime needs of a logged model (MLflow's own guess imports torchvision, which forge lacks)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("torch", "transformers", "tokenizers", "safetensors", "accelerate"):
        try:
            out.append(f"{pkg}=={version(pkg).split('+')[0]}")
        except PackageNotFoundError:
            pass
    return out


def null_tracker() -> Tracker:
    """For ranks other than 0, and for code paths that must not log."""
    return Tracker("", "", enabled=False)
