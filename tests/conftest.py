"""Shared fixtures: a tiny scratch model built once per session, MLflow isolation, and no process
left behind by a test (each process group a test started ends with it, or the test fails)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from forge_testing import tiny_scratch
from servers import adopt_orphans, descendants, end_leftovers

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # as forge.track sets it; tests import mlflow directly too
# session-wide too (module-scoped fixtures run before function-scoped ones): calibration records
# and hardware overrides never reach the user's home
_HOME = tempfile.mkdtemp(prefix="forge-test-home-")
os.environ["FORGE_HARDWARE_FILE"] = os.path.join(_HOME, "hardware.yaml")
os.environ["FORGE_CALIBRATION_DIR"] = os.path.join(_HOME, "calibration")


adopt_orphans()


@pytest.fixture(autouse=True)
def _no_leaked_processes():
    """After each test, no process it started may be left: the descendants of this pytest process
    (only its own: other sessions' processes are never looked at) that were not there before the
    test get 10 s to end, then their process groups are killed and the test fails, naming them."""
    before = descendants()
    yield
    left = end_leftovers(before)
    if left:
        pytest.fail(f"the test left {len(left)} process(es) running (now killed):\n  " + "\n  ".join(left),
                    pytrace=False)


@pytest.fixture(autouse=True)
def _isolated_forge_home(tmp_path, monkeypatch):
    """Calibration records and hardware overrides go to a temp folder, never the user's home."""
    monkeypatch.setenv("FORGE_HARDWARE_FILE", str(tmp_path / "user-hardware.yaml"))
    monkeypatch.setenv("FORGE_CALIBRATION_DIR", str(tmp_path / "calibration"))


@pytest.fixture(autouse=True)
def _isolated_mlflow():
    """Each test starts with no active MLflow run or experiment (as MLflow's own conftest does)."""
    import mlflow
    import mlflow.tracking.fluent as fluent

    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()
    fluent._active_experiment_id = None
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer, hidden-32 Llama with a BPE tokenizer, built once."""
    from forge.inputs import resolve_source
    from forge.recipe import DataSource, GeneratedText, ScratchBase
    from forge.scratch import build_scratch_base

    root = tmp_path_factory.mktemp("tiny")
    gen = resolve_source("general", DataSource(generate=GeneratedText(kind="stories", documents=300)), root)
    dom = resolve_source("domain", DataSource(generate=GeneratedText(kind="facts", documents=300, seed=1)), root)
    cfg = ScratchBase(**tiny_scratch(("general",))["scratch"])
    return build_scratch_base(cfg, [gen, dom], root / "base")


@pytest.fixture(scope="session")
def generated_sources(tiny_checkpoint) -> dict:
    from forge.inputs import resolve_source
    from forge.recipe import DataSource, GeneratedText

    root = tiny_checkpoint.parent
    return {
        "general": resolve_source("general", DataSource(generate=GeneratedText(kind="stories", documents=300)), root),
        "domain": resolve_source("domain", DataSource(generate=GeneratedText(kind="facts", documents=300, seed=1)), root),
    }
