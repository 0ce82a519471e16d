"""Metric rows held back and sent to MLflow together: one store write per training step, made by
MLflow's writer thread, took ~4% of a CPU run's step time (bench/bench_pretrain.py). The rows go
out in one batch with the first row METRICS_EVERY_S after the last send, and as the run ends. The
batches a send hands to MLflow's writer are checked at the next send and as the run ends: a batch
the store refused is the tracker's error (on_error: fail stops the run), never dropped in silence."""
from __future__ import annotations

import re
import time
from typing import Any, Callable

from forge.track.names import METRICS_EVERY_S, METRICS_PER_BATCH

Call = Callable[..., None]  # the tracker's `_call(what, fn, *args)`: a store failure becomes its error


class MetricRows:
    """The rows of each run not sent yet, and the batches sent and not checked yet."""

    def __init__(self, mlflow: Any, call: Call):
        self._mlflow, self._call = mlflow, call
        self._rows: dict[str, list[Any]] = {}  # run id -> rows not sent yet
        self._sending: list[Any] = []  # MLflow's RunOperations of the batches handed to its writer
        self._sent_at = time.monotonic()

    def add(self, run_id: str, items: list[tuple[str, float]], step: int) -> None:
        now = int(time.time() * 1000)
        rows = self._rows.setdefault(run_id, [])
        rows.extend(self._mlflow.entities.Metric(k, v, now, step) for k, v in items)
        if time.monotonic() - self._sent_at >= METRICS_EVERY_S or len(rows) >= METRICS_PER_BATCH:
            self.send()

    def send(self, wait: bool = False) -> None:
        """Check the batches of the send before (written by now, METRICS_EVERY_S ago), then hand the
        rows held to MLflow's writer (a training step does not wait on the store). `wait`: check
        this send's batches too (as a run ends)."""
        self._sent_at = time.monotonic()
        self._check()
        held, self._rows = self._rows, {}
        for run_id, rows in held.items():
            for i in range(0, len(rows), METRICS_PER_BATCH):
                self._call("metrics", self._send, run_id, rows[i:i + METRICS_PER_BATCH])
        if wait:
            self._check()

    def _send(self, run_id: str, rows: list[Any]) -> None:
        self._sending.append(self._mlflow.MlflowClient().log_batch(run_id, metrics=rows, synchronous=False))

    def _check(self) -> None:
        sent, self._sending = self._sending, []
        for operations in sent:
            if operations is not None:
                self._call("metrics", _wait, operations)


def _wait(operations: Any) -> None:
    """Wait for a batch; what the writer met, as its own words (MLflow wraps them in "The following
    failures occurred ...: [MlflowException('...')]")."""
    try:
        operations.wait()
    except Exception as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        inner = re.search(r"operations: \[\w+\((['\"])(.*?)\1[,)]", text)
        raise RuntimeError(inner.group(2) if inner else text) from None
