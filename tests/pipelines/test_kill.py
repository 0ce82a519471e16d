"""Kill tests: a `forge run` subprocess stopped by a signal at several points (mid-stage, during a
checkpoint write, during store creation) leaves a folder that `forge run --resume` finishes, with
the weights an uninterrupted run has, and no run left RUNNING."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from safetensors.torch import load_file

from forge import cli
from forge_testing import REPO, base_recipe, pretrain_stage, write_recipe
from servers import kill_tree, spawn

pytestmark = pytest.mark.slow
STAGE = dict(max_steps=8, checkpoint={"every": 2}, schedule={"kind": "cosine"})
# every batch takes a little longer, so that a signal lands mid-stage (the numbers are unchanged)
SLOW_BATCHES = """
import time
from forge.data.mixing import MixedBlocks
_next = MixedBlocks.next_batch
MixedBlocks.next_batch = lambda self, *a, **k: (time.sleep(0.15), _next(self, *a, **k))[1]
"""


def _recipe(root: Path) -> Path:
    recipe = base_recipe(root, stages=[pretrain_stage(**STAGE)], tracking={"register_model": False})
    return write_recipe(root / "r.yaml", recipe)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run's final weights."""
    root = tmp_path_factory.mktemp("straight")
    assert cli.main(["run", str(_recipe(root))]) == 0
    return load_file(root / "out" / "novella" / "model.safetensors")


def _start(recipe: Path, patch: str, *args: str) -> subprocess.Popen:
    boot = patch + f"\nimport sys\nfrom forge.cli import main\nsys.exit(main({['run', str(recipe), *args]!r}))\n"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # signals at their defaults in the child, whatever this pytest inherited (servers.spawn)
    return spawn([sys.executable, "-c", boot], cwd=REPO, env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True)


def _wait_for(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"forge run ended early ({proc.returncode}):\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > end:
            kill_tree(proc)
            pytest.fail("timed out waiting for the run to get there")
        time.sleep(0.05)


def _runs(out: Path) -> dict[str, str]:
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    return {r.info.run_id: r.info.status for r in mlflow.search_runs(experiment_names=["tiny"], output_format="list")}


def _same(a: dict, out: Path) -> bool:
    b = load_file(out / "novella" / "model.safetensors")
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_sigterm_mid_stage_then_resume(tmp_path, reference):
    recipe, out = _recipe(tmp_path), tmp_path / "out"
    proc = _start(recipe, SLOW_BATCHES)
    _wait_for(proc, lambda: (out / "stages" / "cpt" / "checkpoints" / "step-0000002").is_dir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, proc.stdout.read()[-3000:]  # checkpointed and stopped
    before = json.loads((out / "tracking.json").read_text())
    assert set(_runs(out).values()) == {"KILLED"}
    assert cli.main(["run", str(recipe), "--resume"]) == 0
    assert json.loads((out / "tracking.json").read_text()) == before  # the same parent and stage runs
    assert set(_runs(out).values()) == {"FINISHED"}
    assert _same(reference, out)


def test_sigkill_during_a_checkpoint_write_then_resume(tmp_path, reference):
    recipe, out = _recipe(tmp_path), tmp_path / "out"
    stall = SLOW_BATCHES + """
import torch
_save = torch.save
def save(obj, f, *a, **k):
    _save(obj, f, *a, **k)
    if "step-0000004.partial" in str(f):
        time.sleep(600)  # killed here, half way through writing the step-4 checkpoint
torch.save = save
"""
    proc = _start(recipe, stall)
    partial = out / "stages" / "cpt" / "checkpoints" / "step-0000004.partial" / "training_state.pt"
    _wait_for(proc, partial.is_file)
    proc.kill()
    proc.wait(timeout=30)
    killed = json.loads((out / "tracking.json").read_text())
    assert cli.main(["run", str(recipe)]) == 2  # an interrupted run is not started over by accident
    assert cli.main(["run", str(recipe), "--resume"]) == 0
    status = _runs(out)
    assert status[killed["parent"]] == "FAILED" and status[killed["stages"]["cpt"]] == "FAILED"
    assert "RUNNING" not in status.values()
    assert _same(reference, out)


def test_sigkill_during_store_creation_then_resume(tmp_path, reference):
    recipe, out = _recipe(tmp_path), tmp_path / "out"
    stall = """
import time
import mlflow.store.db.utils as dbu
_upgrade = dbu._upgrade_db
def upgrade(engine):
    time.sleep(600)  # killed here: tables created, migrations not yet run
dbu._upgrade_db = upgrade
"""
    proc = _start(recipe, stall)
    _wait_for(proc, lambda: any(out.glob(".mlflow.db.*.tmp")))
    time.sleep(0.5)
    proc.kill()
    proc.wait(timeout=30)
    assert not (out / "mlflow.db").exists()  # never half a store in place
    assert cli.main(["run", str(recipe), "--resume"]) == 0
    assert not any(out.glob(".mlflow.db.*.tmp"))
    assert set(_runs(out).values()) == {"FINISHED"}
    assert _same(reference, out)
