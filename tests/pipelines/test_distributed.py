"""Two CPU processes on gloo under torchrun: data-parallel training, one set of MLflow runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pytest
from safetensors.torch import load_file

from forge_testing import REPO, base_recipe, pretrain_stage, write_recipe


@pytest.mark.slow
def test_two_process_run_trains_on_twice_the_tokens_and_logs_once(tmp_path):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=3, grad_accum=2)])
    path = write_recipe(tmp_path / "r.yaml", recipe)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FORGE_DEBUG": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "-m", "forge.cli", "run", str(path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    assert lineage["stages"][0]["metrics"]["tokens"] == 3 * (4 * 2 * 32) * 2  # steps x per-rank x ranks
    assert sum(lineage["stages"][0]["tokens_by_source"].values()) == 3 * 4 * 2 * 32 * 2
    load_file(tmp_path / "out" / "novella" / "model.safetensors")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["tiny"], output_format="list")
    assert sorted(r.info.run_name for r in runs) == ["cpt", "tiny"]
    assert all(r.info.status == "FINISHED" for r in runs)
