"""A recipe chaining three stage kinds through `forge run`: pretrain -> midtrain (optimizer
carry-over, WSD schedule, context 128 -> 256) -> soup; each with its MLflow run and lineage."""
from __future__ import annotations

import json

import mlflow
import pytest

from forge import cli
from forge.recipe import load_recipe
from forge_testing import base_recipe, pretrain_stage, write_recipe


@pytest.mark.slow
def test_pretrain_midtrain_soup_chain(tmp_path):
    mid = pretrain_stage("mid", max_steps=3, seq_len=256, batch_size=2,
                         optim={"lr": 1e-3, "carry_over": True},
                         schedule={"kind": "wsd", "decay_fraction": 0.5, "decay": "sqrt", "min_lr_ratio": 0})
    mid.update(kind="midtrain", context={"rope_theta": 20000.0})
    recipe = base_recipe(tmp_path, stages=[pretrain_stage("cpt", max_steps=3), mid,
                                           {"name": "soup", "kind": "soup", "ingredients": ["mid", "cpt"]}],
                         tracking={"register_model": False})
    path = write_recipe(tmp_path / "family.yaml", recipe)
    assert cli.main(["run", str(path)]) == 0

    out = tmp_path / "out"
    lineage = json.loads((out / "novella" / "lineage.json").read_text())
    assert [(s["kind"], s["name"]) for s in lineage["stages"]] == [("pretrain", "cpt"), ("midtrain", "mid"), ("soup", "soup")]
    assert lineage["stages"][1]["context"]["max_position"] == 256
    assert lineage["stages"][2]["ingredients"] == [str(out / "stages" / n / "final") for n in ("mid", "cpt")]
    config = json.loads((out / "novella" / "config.json").read_text())
    assert config["max_position_embeddings"] == 256  # the soup keeps its first ingredient's config
    assert not (out / "novella" / "training_state.pt").exists()  # run state stays out of the model

    loaded = load_recipe(path)
    mlflow.set_tracking_uri(loaded.tracking_uri)
    client = mlflow.MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name(loaded.experiment).experiment_id])
    children = {r.data.tags["mlflow.runName"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert set(children) == {"cpt", "mid", "soup"} and all(r.info.status == "FINISHED" for r in runs)
    assert children["mid"].data.params["optim.carry_over"] == "True"
    assert "plan.chips" in children["mid"].data.params and "plan.chips" not in children["soup"].data.params
    ids = json.loads((out / "tracking.json").read_text())
    assert ids["stages"] == {n: r.info.run_id for n, r in children.items()}
