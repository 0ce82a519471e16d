"""Metric rows held back and sent to MLflow together: one store write per training step, made by
MLflow's writer thread, took ~4% of a CPU run's step time (bench/bench_pretrain.py). The rows go
out in one batch with the first row METRICS_EVERY_S after the last send, and as the run ends. The
batches a send hands to the writer are checked at the next send and as the run ends: a batch the
store refused is the tracker's error (on_error: fail stops the run), never dropped in silence.

The writer is a thread of forge's, not MLflow's asynchronous logging: MLflow's writer polls its
queue once a second, and flushing or ending a run waits for that poll: ~2 s idle per MLflow run (a
one-stage `forge run` has two), which a one-thread executor shut down as the run ends never costs."""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from forge.track.names import METRICS_EVERY_S, METRICS_PER_BATCH

Call = Callable[..., None]  # the tracker's `_call(what, fn, *args)`: a store failure becomes its error


class MetricRows:
    """The rows of each run not sent yet, and the batches sent and not checked yet."""

    def __init__(self, mlflow: Any, call: Call):
        self._mlflow, self._call = mlflow, call
        self._rows: dict[str, list[Any]] = {}  # run id -> rows not sent yet
        self._sending: list[Future[None]] = []  # the batches handed to the writer, not checked yet
        self._writer: ThreadPoolExecutor | None = None  # started by a send, shut down as a run ends
        self._sent_at = time.monotonic()

    def add(self, run_id: str, items: list[tuple[str, float]], step: int) -> None:
        now = int(time.time() * 1000)
        rows = self._rows.setdefault(run_id, [])
        rows.extend(self._mlflow.entities.Metric(k, v, now, step) for k, v in items)
        if time.monotonic() - self._sent_at >= METRICS_EVERY_S or len(rows) >= METRICS_PER_BATCH:
            self.send()

    def send(self, wait: bool = False) -> None:
        """Check the batches of the send before (written by now, METRICS_EVERY_S ago), then hand the
        rows held to the writer (a training step does not wait on the store). `wait`: check this
        send's batches too and stop the writer (as a run ends)."""
        self._sent_at = time.monotonic()
        self._check()
        held, self._rows = self._rows, {}
        for run_id, rows in held.items():
            for i in range(0, len(rows), METRICS_PER_BATCH):
                self._call("metrics", self._send, run_id, rows[i:i + METRICS_PER_BATCH])
        if wait:
            try:
                self._check()
            finally:
                if self._writer is not None:  # nothing left to write: its thread ends at once
                    self._writer.shutdown(wait=True)
                    self._writer = None

    def _send(self, run_id: str, rows: list[Any]) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-metrics")  # one: in order
        client = self._mlflow.MlflowClient()  # in the caller's thread: the tracking URI set there
        self._sending.append(self._writer.submit(client.log_batch, run_id, metrics=rows, synchronous=True))

    def _check(self) -> None:
        sent, self._sending = self._sending, []
        for batch in sent:
            self._call("metrics", _wait, batch)


def _wait(batch: Future[None]) -> None:
    """Wait for a batch; what the writer met, in its first line."""
    try:
        batch.result()
    except Exception as e:
        raise RuntimeError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
