"""Library internals forge calls are listed and wrapped in one place each (forge.train.accel for
accelerate and torch, forge.track.internals for MLflow). When a release moves one, this fails and
names the wrapper to update, before a stage fails somewhere in the middle of a run."""
from __future__ import annotations

import importlib

import pytest

from forge.track import internals
from forge.train import accel


@pytest.mark.parametrize("where,module,name", [("forge.train.accel", m, n) for m, n in accel.PRIVATE]
                         + [("forge.track.internals", m, n) for m, n in internals.PRIVATE])
def test_every_internal_forge_wraps_is_still_there(where, module, name):
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part, None)
        assert found is not None, f"{module}.{name} is gone in this release: update its wrapper in {where}"


def test_the_wrappers_do_what_they_say(tmp_path):
    import mlflow

    from forge.track.store import prepare_sqlite_store

    db = tmp_path / "m.db"
    prepare_sqlite_store(db)  # initialize_tables + latest_schema_revision
    assert len(internals.latest_schema_revision()) >= 6 and db.stat().st_size > 0
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    try:
        mlflow.start_run(experiment_id=mlflow.create_experiment("internals"))  # explicit: no env or global default
        assert mlflow.active_run() is not None
        internals.forget_active_run()
        assert mlflow.active_run() is None
    finally:
        mlflow.set_tracking_uri(None)
    assert accel.new_accelerator("fp32", "test").mixed_precision == "no"
    assert accel.new_accelerator("bf16", "test").mixed_precision == "bf16"  # accelerate refuses it without the reset
