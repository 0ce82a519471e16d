"""MlflowTracker (forge.track.protocol.Tracker through MLflow): forge's runs (one parent per pipeline,
a nested child per stage), their params, metrics, summaries, descriptions, datasets and artifacts,
and the registry calls. The experiment is created as a model-development one, and a top-level run
with child runs (a pipeline's parent) leaves, as it ends, the experiment's shared view the UI
links open (forge.track.experiment, forge.track.view).

Every text it writes (tags, params, descriptions, summaries, datasets, text, dict and table
artifacts, registry tags and descriptions, the error of a failed run) passes `forge.scrub` first.

It hides MLflow's limits: every metric, param and tag name passes `forge.track.names.mlflow_key`
(a name MLflow refuses, too long or with a character it does not take, is shortened with a hash; the
run's names.json keeps the full names); params are flattened, truncated to MLflow's value length and sent in
batches, and never kept with a different value silently (MLflow cannot change one: `log_params`
refuses the change, `log_summary` says which params kept their earlier value); only rank 0 logs
(other ranks get a tracker with `enabled=False`, which does nothing). A
run left by an exception is ended FAILED with the error message, so nothing stays RUNNING.
Mid-run, a failing store either stops the run (`on_error="fail"`) or its records are buffered
and retried while training goes on (`on_error="buffer"`), saying so. Metric rows sent in the
background are checked at the next send and as the run ends: a batch the store refused fails the
run in on_error: fail, never dropped in silence.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from forge.errors import ForgeError
from forge.scrub import first_line, scrub, scrub_dict, scrub_tree
from forge.track import internals, registry
from forge.track.experiment import after_run, use_experiment
from forge.track.names import (
    KEPT_TAG,
    MAX_PARAM_VALUE,
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    Keys,
    flatten,
    metric_name,
    mlflow_key,
    param_conflicts,
    saved_names,
    summary_value,
)
from forge.track.sending import MetricRows
from forge.track.store import check_store_uri, fail_fast, prepare_sqlite_store


class MlflowTracker:
    """Runs, params, metrics, datasets, artifacts and the model registry, through MLflow."""

    def __init__(self, uri: str, experiment: str, enabled: bool = True, artifact_dir: str | None = None,
                 on_error: str = "fail", system_metrics: bool = False):
        """`artifact_dir`: where a new experiment keeps artifacts (default: beside a SQLite store).
        `on_error`: "fail" (a store failure mid-run stops the run) or "buffer" (keep training,
        keep the records and retry them). `system_metrics`: nested (stage) runs log CPU, memory
        and GPU use through MLflow's sampler."""
        self.enabled, self.uri, self.experiment, self.on_error = enabled, uri, experiment, on_error
        self.system_metrics = system_metrics
        self._summaries: dict[str, dict[str, dict[str, str]]] = {}  # run id -> section -> name -> value
        self._pending: list[tuple[str, Callable[[], Any]]] = []  # (what, call) the store refused, in order, for on_error="buffer"
        self._buffered = 0
        self._keys = Keys()
        if not enabled:
            return
        import mlflow

        self._mlflow = mlflow
        self._metric_rows = MetricRows(mlflow, self._call)  # held back and sent together (log_metrics)
        # log_summary appends to a table artifact, which MLflow downloads first: no progress bars
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        check_store_uri(uri)
        if uri.startswith("sqlite:///"):
            db = Path(uri.removeprefix("sqlite:///"))
            prepare_sqlite_store(db)
            artifact_dir = artifact_dir or str(db.parent / "mlartifacts")
        try:
            with fail_fast(uri):  # a server that does not answer: say so now, not after minutes of retries
                mlflow.set_tracking_uri(uri)
                use_experiment(mlflow, experiment, artifact_dir)  # a model-development experiment
        except Exception as e:  # MlflowException, or the HTTP client's connection errors
            raise ForgeError(f"MLflow store {uri}: cannot be used: {first_line(e)}") from None

    # ---------------------------------------------------------------------- store faults
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Send one record to the store: retried later (buffer) or a forge error (fail) if it fails."""
        if self._pending:
            self._flush()
        if self._pending:  # still failing: keep order, queue behind the others
            self._pending.append((what, lambda: fn(*args, **kwargs)))
            return
        try:
            fn(*args, **kwargs)
        except Exception as e:
            if self.on_error != "buffer":
                raise ForgeError(f"MLflow store failed while logging {what}: {first_line(e)} "
                                 f"({self.uri}); to keep training through store failures, set "
                                 "tracking.on_error: buffer") from None
            self._pending.append((what, lambda: fn(*args, **kwargs)))
            self._buffered += 1
            if self._buffered == 1:
                why = first_line(e)
                print(f"forge: warning: MLflow store failed while logging {what}: {why}; "
                      "training goes on, buffering records and retrying", file=sys.stderr, flush=True)

    def _flush(self) -> None:
        while self._pending:
            what, call = self._pending[0]
            try:
                call()
            except Exception:
                return
            self._pending.pop(0)
            if not self._pending:
                print("forge: MLflow store reachable again: the buffered records were delivered", file=sys.stderr,
                      flush=True)

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
        full = tags or {}
        tags = {mlflow_key(k): scrub(str(v)) for k, v in full.items()} if tags else tags
        if run_id is not None:
            run = mlflow.start_run(run_id=run_id, nested=nested, log_system_metrics=nested and self.system_metrics)
            if tags:
                mlflow.set_tags(tags)
        else:
            run = mlflow.start_run(run_name=name, nested=nested, tags=tags,
                                   log_system_metrics=nested and self.system_metrics)
        status = "FINISHED"
        try:
            for k in full:  # the full names of tag keys mlflow_key changed, in the run's names.json
                self._keys.key(run.info.run_id, k)
            self._save_keys()
            yield run.info.run_id
            self._metric_rows.send(wait=True)  # in the body: a store failing now fails the run (on_error: fail)
        except BaseException as e:
            stopped = isinstance(e, KeyboardInterrupt) or getattr(e, "stopped_on_request", False)
            status = "KILLED" if stopped else "FAILED"
            message = f"{type(e).__name__}: {e}" if not str(e).startswith(type(e).__name__) else str(e)
            if isinstance(e, SystemExit):
                message = f"stopped with exit status {e.code} (terminated, or another process of the launch failed)"
            message = scrub(message)
            # a second signal (the one that "stops at once") waits the few ms it takes to say why
            with _signals_deferred(), contextlib.suppress(Exception):
                mlflow.set_tags({"error": message[:5000], "mlflow.note.content": f"Failed: {message[:5000]}"})
            raise
        finally:
            # the run always ends, whatever else fails here: nothing is left RUNNING
            with contextlib.suppress(Exception):  # a failing store: said below, or by the error that got us here
                self._metric_rows.send(wait=True)
            self._flush()
            if self._pending:
                print(f"forge: warning: {len(self._pending)} record(s) could not be logged to the MLflow store "
                      f"({', '.join(sorted({w for w, _ in self._pending}))}); they are lost", file=sys.stderr)
                self._pending.clear()
            try:
                mlflow.flush_async_logging()
            finally:
                try:
                    with _signals_deferred():  # a second signal must not leave the run RUNNING
                        mlflow.end_run(status)
                except Exception as e:  # the store is gone: never hide the error that got us here
                    with contextlib.suppress(Exception):
                        internals.forget_active_run()
                    print(f"forge: warning: could not mark the MLflow run {status} ({first_line(e, 200)}); "
                          "the next run in this folder marks it FAILED", file=sys.stderr)
                else:
                    if not nested:  # a pipeline's parent: the experiment's view shows it (forge.track.view)
                        after_run(mlflow, run.info.run_id, self.uri)

    def run_status(self, run_id: str) -> str | None:
        """'RUNNING', 'FINISHED', 'FAILED' or 'KILLED'; None if the store has no such run."""
        if not self.enabled:
            return None
        try:
            return str(self._mlflow.MlflowClient().get_run(run_id).info.status)
        except self._mlflow.exceptions.MlflowException:
            return None

    def end_stale(self, run_id: str, message: str) -> None:
        """Mark a run that a killed process left RUNNING as FAILED, saying why."""
        if not self.enabled:
            return
        client, message = self._mlflow.MlflowClient(), scrub(message)
        client.set_tag(run_id, "error", message[:5000])
        client.set_tag(run_id, "mlflow.note.content", f"Failed: {message[:5000]}")
        client.set_terminated(run_id, "FAILED")

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.enabled:
            active = self._mlflow.active_run()
            run_id = active.info.run_id if active is not None else ""
            self._call("tags", self._mlflow.set_tags, {self._keys.key(run_id, k): scrub(str(v))[:5000]
                                                       for k, v in tags.items()})
            self._save_keys()

    def _save_keys(self) -> None:
        """Each run's names.json: the full names of the keys mlflow_key changed (written when one is added)."""
        for run_id, names in self._keys.unsaved().items():
            if run_id:
                names = {**saved_names(self._mlflow, run_id), **names}  # a resumed run keeps its earlier entries
                self._call("names.json", self._mlflow.MlflowClient().log_dict, run_id, scrub_dict(names), "names.json")

    # ------------------------------------------------------------------- params, metrics
    def log_params(self, params: dict[str, Any]) -> None:
        """Log params into the active run. MLflow refuses to change a param: a value that differs
        from the one the run already has is a ForgeError naming both (the same value again is a
        no-op), so nothing is kept with a different value silently."""
        if not self.enabled:
            return
        active = self._mlflow.active_run()
        run_id = active.info.run_id if active is not None else "(new)"
        flat = {self._keys.key(run_id if active is not None else "", k): scrub(v)[:MAX_PARAM_VALUE]
                for k, v in flatten(params).items()}
        self._save_keys()
        existing = self._params_of(run_id) if active is not None else {}
        conflicts = param_conflicts(existing, flat)
        if conflicts:
            raise ForgeError(f"MLflow run {run_id}: " + "; ".join(f"param {c}" for c in conflicts) +
                             ": params cannot change in a run; log the new figures under a new run")
        items = [(k, v) for k, v in flat.items() if k not in existing]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self._call("params", self._mlflow.log_params, dict(items[i:i + PARAMS_PER_BATCH]))

    def _params_of(self, run_id: str) -> dict[str, str]:
        try:
            return dict(self._mlflow.MlflowClient().get_run(run_id).data.params)
        except Exception:  # the store is failing: the calls that follow fail or buffer, as configured
            return {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Metrics of the active run at `step`, held back and sent together (forge.track.sending)."""
        if not self.enabled or not metrics:
            return
        active = self._mlflow.active_run()
        run_id = active.info.run_id if active is not None else ""
        items = [(self._keys.key(run_id, metric_name(k)), float(v)) for k, v in metrics.items()]
        self._save_keys()
        if self.on_error == "buffer" or active is None:  # synchronous, so that a failure is seen and the batch kept
            for i in range(0, len(items), METRICS_PER_BATCH):
                self._call("metrics", self._mlflow.log_metrics, dict(items[i:i + METRICS_PER_BATCH]), step=step,
                           synchronous=self.on_error == "buffer")
            return
        self._metric_rows.add(run_id, items, step or 0)

    def log_summary(self, section: str, values: dict[str, Any], run_id: str | None = None) -> None:
        """Single figures (final results, the plan, predicted vs measured, hygiene counts, the
        evaluation): not one-point metric charts but params `section.name` and rows of the run's
        `summary.json` table (section, name, value), readable on the run page and in the artifact
        view. `run_id`: another run than the active one (a finished stage's, evaluated later)."""
        if not self.enabled or not values:
            return
        run_id = run_id or self._mlflow.active_run().info.run_id
        shown = {k: scrub(summary_value(v)) for k, v in values.items()}
        table = self._summaries.setdefault(run_id, {}).setdefault(section, {})
        new = {k: v for k, v in shown.items() if table.get(k) != v}
        table.update(shown)
        params = self._params_of(run_id)
        # a param cannot change once logged (a resumed run): the changed figure goes to the table,
        # and the run says which params kept their earlier value (a tag, and a line on stderr)
        self._say_kept(run_id, param_conflicts(params, {f"{section}.{k}": v for k, v in new.items()}))
        keys = {k: self._keys.key(run_id, f"{section}.{k}") for k in new}
        self._save_keys()
        fresh = [(keys[k], v[:MAX_PARAM_VALUE]) for k, v in new.items() if keys[k] not in params]
        for i in range(0, len(fresh), PARAMS_PER_BATCH):
            self._call("params", self._log_params_to, run_id, fresh[i:i + PARAMS_PER_BATCH])
        if new:
            rows = {"section": [section] * len(new), "name": list(new), "value": list(new.values())}
            self._call("summary", self._log_table, rows, "summary.json", run_id)  # values scrubbed above

    def _say_kept(self, run_id: str, kept: list[str]) -> None:
        """Params that keep their earlier value while the summary table has the new one."""
        if not kept:
            return
        print(f"forge: note: MLflow run {run_id} keeps its earlier params ({'; '.join(kept)}): params cannot "
              "change in a run; the new figures are in its summary.json", file=sys.stderr)
        previous = self._tags_of(run_id).get(KEPT_TAG, "")
        text = "; ".join(x for x in [previous, *kept] if x)
        self._call("tags", self._mlflow.MlflowClient().set_tag, run_id, KEPT_TAG, text[:5000])

    def _tags_of(self, run_id: str) -> dict[str, str]:
        try:
            return dict(self._mlflow.MlflowClient().get_run(run_id).data.tags)
        except Exception:
            return {}

    def _log_params_to(self, run_id: str, params: list[tuple[str, str]]) -> None:
        from mlflow.entities import Param

        self._mlflow.MlflowClient().log_batch(run_id, params=[Param(k, v) for k, v in params])

    def _log_table(self, rows: dict[str, list[Any]], artifact_file: str, run_id: str | None = None) -> None:
        with warnings.catch_warnings():  # pandas' dtype advisories from inside MLflow
            warnings.simplefilter("ignore")
            self._mlflow.log_table(rows, artifact_file=artifact_file, run_id=run_id)

    def describe(self, markdown: str) -> None:
        """The active run's description (MLflow's run note, shown at the top of the run page)."""
        if self.enabled:
            self._call("description", self._mlflow.set_tag, "mlflow.note.content", scrub(markdown)[:5000])

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
            source = resolve_dataset_source(scrub(path))
        dataset = MetaDataset(source, name=name, digest=digest[:32])
        self._call("datasets", self._mlflow.log_input, dataset, context=context, tags=scrub_tree(tags))

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.enabled:
            self._call(artifact_file, self._mlflow.log_text, scrub(text), artifact_file)

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        if self.enabled:
            self._call(artifact_file, self._mlflow.log_dict, scrub_dict(data), artifact_file)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        if self.enabled:
            self._call(str(path), self._mlflow.log_artifact, str(path), artifact_path)

    def log_bytes(self, data: bytes, artifact_file: str) -> None:
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(artifact_file).name
            p.write_bytes(data)
            parent = str(Path(artifact_file).parent)
            self._mlflow.log_artifact(str(p), None if parent == "." else parent)

    # ------------------------------------------------------- registry (forge.track.registry)
    def register_model(self, model_dir: str | os.PathLike[str], name: str, alias: str,
                       tags: dict[str, str], files: tuple[str, ...] = ()) -> int | None:
        """Log a Hugging Face checkpoint as an MLflow transformers model, register it, set the alias;
        `files` of the folder (lineage.json) travel with the model (forge.track.registry)."""
        if not self.enabled:
            return None
        return registry.register_model(model_dir, name, alias, scrub_tree(tags), files)

    def describe_model(self, name: str, version: int, markdown: str, model_markdown: str | None = None) -> None:
        """The version's description (Markdown, on its registry page); the registered model gets
        `model_markdown` (default: the same) when it has no description yet."""
        if self.enabled:
            model_markdown = None if model_markdown is None else scrub(model_markdown)
            registry.describe_model(name, version, scrub(markdown), model_markdown)

    def alias_version(self, name: str, alias: str) -> tuple[int, dict[str, str]] | None:
        """The registered version holding `alias` and its tags; None if none does (or no such model)."""
        return registry.alias_version(name, alias) if self.enabled else None

    def set_alias(self, name: str, alias: str, version: int) -> None:
        if self.enabled:
            registry.set_alias(name, alias, version)

    def set_version_tags(self, name: str, version: int, tags: dict[str, str]) -> None:
        if self.enabled:
            registry.set_version_tags(name, version, scrub_tree(tags))

    def log_table(self, table: dict[str, list[Any]], artifact_file: str) -> None:
        """A table (column -> values) as an MLflow table artifact (JSON), e.g. sample generations."""
        if self.enabled:
            self._mlflow.log_table(data=scrub_tree(table), artifact_file=artifact_file)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """A SIGTERM or SIGINT arriving during the block is held and handed to its handler at the end
    (main thread only; Python runs signal handlers there, whichever thread the signal reached)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, Any]] = []
    previous: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum, frame in caught[:1]:
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def null_tracker() -> MlflowTracker:
    """For ranks other than 0, and for code paths that must not log."""
    return MlflowTracker("", "", enabled=False)
