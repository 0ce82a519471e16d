"""Secrets in the environment (cloud keys, hub tokens) never reach MLflow or the output folder."""
from __future__ import annotations

import secrets

import mlflow
import pytest

from forge import cli
from forge.recipe import load_recipe
from forge_testing import base_recipe, pretrain_stage, write_recipe

PLANTED = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
           "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "GITHUB_TOKEN", "MLFLOW_TRACKING_PASSWORD",
           "DATABASE_URL", "WANDB_API_KEY")


def _mlflow_strings(recipe) -> str:
    """Every param, tag and metric name of every run and registered version, as MLflow returns them."""
    mlflow.set_tracking_uri(recipe.tracking_uri)
    client = mlflow.MlflowClient()
    parts = []
    for exp in client.search_experiments():
        parts += [exp.name, repr(exp.tags)]
        for run in client.search_runs([exp.experiment_id]):
            parts += [repr(run.data.params), repr(run.data.tags), repr(list(run.data.metrics))]
    for model in client.search_registered_models():
        parts.append(repr(model.tags))
        for version in client.search_model_versions(f"name='{model.name}'"):
            parts += [repr(version.tags), version.source or ""]
    return "\n".join(parts)


@pytest.mark.slow
def test_planted_environment_secrets_reach_nothing(tmp_path, monkeypatch, capfd):
    planted = {name: f"PLANTED{secrets.token_hex(12)}" for name in PLANTED}
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)])
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["run", str(path)]) == 0
    loaded = load_recipe(path)
    out = tmp_path / "out"
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in files) and any("mlartifacts" in p.parts for p in files)
    blob = b"".join(p.read_bytes() for p in files)  # the store, artifacts, checkpoints, the Novella
    seen = capfd.readouterr()
    text = _mlflow_strings(loaded) + seen.out + seen.err
    leaked = [name for name, value in planted.items() if value.encode() in blob or value in text]
    assert not leaked, f"planted secrets found in the outputs: {leaked}"
    assert "PLANTED" not in text and b"PLANTED" not in blob
