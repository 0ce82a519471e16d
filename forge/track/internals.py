"""MLflow internals forge calls, each wrapped once here with the public alternative it lacks.
tests/track/test_internals.py (or tests/test_internals.py) fails, naming the wrapper, when an MLflow
release moves one."""
from __future__ import annotations

from typing import Any

PRIVATE = (("mlflow.tracking.fluent", "_active_run_stack"), ("mlflow.store.db.utils", "_initialize_tables"),
           ("mlflow.store.db.utils", "_get_latest_schema_revision"))


def forget_active_run() -> None:
    """Drop the fluent API's active run without asking the store. `mlflow.end_run` is the public way,
    but it writes the run's status to the store: when the store is gone it fails and leaves the run
    active, and every later `start_run` in the process refuses."""
    import mlflow.tracking.fluent as fluent

    getattr(fluent, "_active_run_stack").get().clear()


def initialize_tables(engine: Any) -> None:
    """Create a new store's whole schema, migrations included, on a SQLAlchemy engine. The public way
    (`mlflow.tracking.MlflowClient` on a new sqlite URI) does it too, but in the store's final place,
    where a kill midway leaves a half-built store; forge builds it in a temporary file and links it."""
    import mlflow.store.db.utils as dbu

    getattr(dbu, "_initialize_tables")(engine)


def latest_schema_revision() -> str:
    """The alembic revision this MLflow expects of a store. No public API names it; `mlflow db
    upgrade` applies it without saying."""
    import mlflow.store.db.utils as dbu

    return str(getattr(dbu, "_get_latest_schema_revision")())
