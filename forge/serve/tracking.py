"""Each training client an MLflow run (forge.track.MlflowTracker) in the config's experiment: its
base and LoRA settings as params, each optim_step's loss, tokens, gradient norm and learning rate
as metrics at the step's number, each saved checkpoint (tinker path and folder) in checkpoints.json
and a tag; with `register:`, each save_state's weights a new version of that registered model
(forge.serve.registration). A run is written by its own thread, which holds it open (MLflow's
active run is per-thread) from the model's creation until its session ends: a slow or failing store
delays no model call, and its records are buffered and retried (the tracker's on_error: buffer)."""
from __future__ import annotations

import logging
import queue
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from forge.serve import registration
from forge.serve.config import TrackingSpec

log = logging.getLogger("forge.serve")
Write = Callable[[Any], None]  # a record: a call on the run's MlflowTracker


def open_store(spec: TrackingSpec) -> None:
    """Create (or check) the store and the experiment now: a bad tracking config stops the server
    at start, not a client's first step."""
    from forge.track import MlflowTracker

    MlflowTracker(spec.uri, spec.experiment, on_error="fail")


class RunLog:
    def __init__(self, spec: TrackingSpec, name: str, tags: dict[str, str], params: dict[str, Any],
                 scratch: Path | None = None):
        """`name`: the training run's id; `scratch`: where registration copies and merges a checkpoint."""
        self.spec, self.name, self.tags, self.params = spec, name, tags, params
        self.scratch = scratch or Path(tempfile.gettempdir()) / "forge-serve"
        self.run_id: str | None = None
        self.checkpoints: list[dict[str, Any]] = []
        self._queue: queue.Queue[Write | None] = queue.Queue()
        self._dead = False  # the tracker failed: records are dropped
        self._thread = threading.Thread(target=self._run, name=f"forge-serve-mlflow {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from forge.track import MlflowTracker

        try:
            tracker = MlflowTracker(self.spec.uri, self.spec.experiment, on_error="buffer")
            with tracker.run(self.name, self.tags) as run_id:
                self.run_id = run_id
                tracker.log_params(self.params)
                while (write := self._queue.get()) is not None:
                    write(tracker)
        except Exception:  # tracking never stops training: said in the server's log
            self._dead = True
            log.exception("MLflow run of %s failed; the client trains on, untracked", self.name)

    def _put(self, write: Write) -> None:
        if not self._dead:
            self._queue.put(write)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        figures = {"loss": metrics.get("loss:sum"), "tokens": metrics.get("tokens"), "grad_norm":
                   metrics.get("grad_norm"), "lr": metrics.get("learning_rate")}
        kept = {k: float(v) for k, v in figures.items() if v is not None}
        self._put(lambda t: t.log_metrics(kept, step=step))

    def checkpoint(self, tinker_path: str, folder: str, step: int) -> None:
        self.checkpoints.append({"tinker_path": tinker_path, "folder": folder, "step": step})
        listed = {"checkpoints": list(self.checkpoints)}

        def write(t: Any) -> None:
            t.log_dict(listed, "checkpoints.json")
            t.set_tags({"last_checkpoint": tinker_path})

        self._put(write)

    def register(self, folder: Path, tinker_path: str, step: int) -> None:
        """A save_state checkpoint as a new version of the config's registered model (if it names
        one): copied now, on the worker; merged and registered on the run's thread."""
        name = self.spec.model_name
        if name is None or self._dead:
            return
        try:
            saved = registration.snapshot(folder, self.scratch / "registering", tinker_path, self.name, step)
        except OSError:
            log.exception("registering %s as %s failed; the checkpoint is saved, unregistered", tinker_path, name)
            return

        def write(t: Any) -> None:
            registration.register(t, name, saved)

        self._put(write)

    def tag(self, tags: dict[str, str]) -> None:
        self._put(lambda t: t.set_tags(tags))

    def close(self, wait: bool = True) -> None:
        """End the run (FINISHED) once its records are written."""
        self._queue.put(None)
        if wait:
            self._thread.join(120)
