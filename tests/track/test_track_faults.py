"""Tracking faults: the SQLite store is created whole or not at all; a damaged, half-built or
locked store is refused before any work with a message naming it; mid-run store failures either
fail the run or (tracking.on_error: buffer) are buffered and retried while training goes on; runs
an earlier, killed process left RUNNING are marked FAILED."""
from __future__ import annotations

import sqlite3
import time

import mlflow
import pytest

from forge.errors import ForgeError
from forge.track import MlflowTracker


@pytest.mark.slow
def test_store_is_created_whole_and_reused(tmp_path):
    db = tmp_path / "mlflow.db"
    MlflowTracker(f"sqlite:///{db}", "e")
    assert db.is_file() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from alembic_version").fetchone()[0] == 1
    MlflowTracker(f"sqlite:///{db}", "e")  # a second process opens it as it is


@pytest.mark.slow
def test_damaged_store_is_a_clear_error_and_an_empty_file_is_replaced(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"")  # holds nothing: made into a store
    MlflowTracker(f"sqlite:///{db}", "e")
    db.write_bytes(b"this is not a database" * 100)
    start = time.monotonic()
    with pytest.raises(ForgeError, match=r"MLflow store .*mlflow\.db.*move it aside"):
        MlflowTracker(f"sqlite:///{db}", "e")
    assert time.monotonic() - start < 20  # no minute of retries


def test_half_built_store_is_a_clear_error(tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:  # what a kill during the migrations used to leave
        conn.execute("create table alembic_version (version_num varchar(32) not null)")
        conn.execute("insert into alembic_version values ('451aebb31d03')")
        conn.execute("create table experiments (experiment_id integer)")
    with pytest.raises(ForgeError, match=r"(?s)mlflow\.db.*schema.*451aebb31d03.*move it aside"):
        MlflowTracker(f"sqlite:///{db}", "e")


@pytest.mark.slow
def test_locked_store_fails_fast(tmp_path):
    db = tmp_path / "mlflow.db"
    MlflowTracker(f"sqlite:///{db}", "e")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("begin exclusive")
    try:
        start = time.monotonic()
        with pytest.raises(ForgeError, match=r"MLflow store .*mlflow\.db.*locked"):
            MlflowTracker(f"sqlite:///{db}", "e")
        assert time.monotonic() - start < 30
    finally:
        holder.execute("rollback")
        holder.close()


def _failing(monkeypatch, tracker, name: str, times: int):
    """`tracker`'s MLflow module's `name` (or `name` of another object) fails its first `times` calls."""
    owner = getattr(tracker, "_mlflow", tracker)
    real, calls = getattr(owner, name), {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= times:
            raise mlflow.exceptions.MlflowException("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, flaky)


@pytest.mark.slow
def test_buffer_mode_keeps_going_and_delivers_later(tmp_path, monkeypatch, capsys):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e", on_error="buffer")
    _failing(monkeypatch, tracker, "log_metrics", 2)
    with tracker.run("r") as run_id:
        for step in (1, 2, 3):
            tracker.log_metrics({"loss": float(step)}, step=step)
    history = mlflow.MlflowClient().get_metric_history(run_id, "train/loss")  # forge's "loss", as MLflow shows it
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 2.0), (3, 3.0)]
    err = capsys.readouterr().err
    assert "buffering" in err and "database is locked" in err and "delivered" in err


def test_fail_mode_stops_with_a_forge_error_and_ends_the_run_failed(tmp_path, monkeypatch):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    _failing(monkeypatch, mlflow.MlflowClient, "log_batch", 1)  # how held-back metric rows are sent
    with pytest.raises(ForgeError, match=r"MLflow store failed .*metrics.*tracking\.on_error: buffer"):
        with tracker.run("r") as run_id:
            tracker.log_metrics({"loss": 1.0}, step=1)
    assert mlflow.MlflowClient().get_run(run_id).info.status == "FAILED"


def test_fresh_run_marks_runs_left_running_failed(tmp_path):
    from forge.track.runs import RunIds

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("e").experiment_id
    parent, child = client.create_run(exp).info.run_id, client.create_run(exp).info.run_id  # a killed run's
    runs = RunIds(tmp_path / "tracking.json", parent, {"cpt": child})
    runs.save()
    RunIds.load(tmp_path).discard(tracker)
    assert [client.get_run(r).info.status for r in (parent, child)] == ["FAILED", "FAILED"]


@pytest.mark.slow
def test_store_gone_at_the_end_never_hides_the_error(tmp_path, monkeypatch, capsys):
    """An output made read-only mid-run: the run's own error is what the user sees."""
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")

    def readonly(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("attempt to write a readonly database")

    monkeypatch.setattr(tracker._mlflow, "end_run", readonly)
    with pytest.raises(ForgeError, match="cannot write checkpoint"):
        with tracker.run("r"):
            raise ForgeError("cannot write checkpoint x: Read-only file system")
    assert "could not mark the MLflow run FAILED" in capsys.readouterr().err
    monkeypatch.undo()
    assert mlflow.active_run() is None  # the next run starts clean


def test_unreachable_server_fails_fast():
    start = time.monotonic()
    with pytest.raises(ForgeError, match=r"MLflow store http://127\.0\.0\.1:9: cannot be used"):
        MlflowTracker("http://127.0.0.1:9", "e")
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_metric_rows_are_sent_together_and_all_arrive_with_their_steps_and_times(tmp_path, monkeypatch):
    """Rows are held back (one store write per training step slowed CPU steps ~4%) and sent by the
    first row METRICS_EVERY_S after the last send, and when the run ends: none lost, none reordered."""
    import forge.track.sending as sending

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    sends = []
    real = mlflow.MlflowClient.log_batch

    def counted(self, run_id, metrics=(), **kwargs):
        sends.append(sorted(m.step for m in metrics))
        return real(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(mlflow.MlflowClient, "log_batch", counted)
    monkeypatch.setattr(sending, "METRICS_EVERY_S", 3600.0)
    with tracker.run("r") as run_id:
        for step in (1, 2, 3):
            tracker.log_metrics({"loss": float(step), "lr": 0.1 * step}, step=step)
            time.sleep(0.002)  # distinct timestamps
        assert sends == []  # held back
        monkeypatch.setattr(sending, "METRICS_EVERY_S", 0.0)
        tracker.log_metrics({"loss": 4.0}, step=4)  # the first row due: sends everything held
        tracker.log_metrics({"loss": 5.0}, step=5)
    assert sends == [[1, 1, 2, 2, 3, 3, 4], [5]]
    history = mlflow.MlflowClient().get_metric_history(run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in (1, 2, 3, 4, 5)]
    times = [m.timestamp for m in sorted(history, key=lambda m: m.step)]
    assert times == sorted(times) and len(set(times[:3])) == 3  # each row keeps the time it was logged at
    assert len(mlflow.MlflowClient().get_metric_history(run_id, "train/lr")) == 3


@pytest.mark.slow
def test_a_metric_batch_the_store_rejects_fails_the_run_in_fail_mode(tmp_path, monkeypatch):
    """Held-back rows go to the store on MLflow's writer thread; a batch it rejects there used to be
    logged by MLflow and dropped, the run FINISHED with no metrics. In on_error: fail it fails the run."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    real = SqlAlchemyStore.log_batch

    def refuses_metrics(self, run_id, metrics, params, tags):
        if metrics:
            raise mlflow.exceptions.MlflowException("database disk image is malformed")
        return real(self, run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", refuses_metrics)  # before the store (and its writer) exist
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    with pytest.raises(ForgeError, match=r"MLflow store failed while logging metrics: .*malformed.*on_error: buffer"):
        with tracker.run("r") as run_id:
            tracker.log_metrics({"loss": 1.0}, step=1)
    monkeypatch.undo()
    assert mlflow.MlflowClient().get_run(run_id).info.status == "FAILED"


@pytest.mark.slow
def test_a_rejected_batch_fails_the_run_at_the_next_send_not_only_at_its_end(tmp_path, monkeypatch):
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    import forge.track.sending as sending

    real, calls = SqlAlchemyStore.log_batch, {"n": 0}

    def first_refused(self, run_id, metrics, params, tags):
        if metrics:
            calls["n"] += 1
            if calls["n"] == 1:
                raise mlflow.exceptions.MlflowException("database is locked")
        return real(self, run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", first_refused)
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    monkeypatch.setattr(sending, "METRICS_EVERY_S", 0.0)  # every row is sent at once
    steps = []
    with pytest.raises(ForgeError, match=r"logging metrics: .*database is locked"):
        with tracker.run("r"):
            for step in range(1, 4):
                tracker.log_metrics({"loss": float(step)}, step=step)
                steps.append(step)
    assert steps == [1]  # the send of step 2 saw that step 1's batch was refused
