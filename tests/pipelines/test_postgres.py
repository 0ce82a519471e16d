"""A team's tracking server on a real database: PostgreSQL behind `forge ui --tracking-uri`, a tiny
recipe tracked to it over HTTP; its runs, metrics, artifacts and registered model are all there."""
from __future__ import annotations

import mlflow
import pytest

from forge import cli
from forge_testing import base_recipe, pretrain_stage, write_recipe
from servers import forge_ui, postgres_cluster


@pytest.mark.slow
def test_recipe_tracked_to_postgres_backed_server(tmp_path):
    with postgres_cluster() as db, forge_ui("--tracking-uri", db, "--artifacts", str(tmp_path / "artifacts")) as ui:
        url, base = ui.url, ui.base
        assert url.startswith(f"{base}/#/experiments?workflowType=machine_learning")  # no experiment yet
        recipe = base_recipe(tmp_path, stages=[pretrain_stage("cpt", max_steps=3)],
                             tracking={"uri": base, "alias": "team"})
        assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0
        mlflow.set_tracking_uri(base)
        client = mlflow.MlflowClient()
        exp = client.get_experiment_by_name("tiny")
        runs = client.search_runs([exp.experiment_id])
        parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
        stage = next(r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id)
        assert parent.info.status == stage.info.status == "FINISHED" and stage.info.run_name == "cpt"
        assert len(client.get_metric_history(stage.info.run_id, "train/loss")) == 3
        assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"lineage.json", "stages.json"}
        assert "plan/plan_targets.png" in {a.path for a in client.list_artifacts(stage.info.run_id, "plan")}
        version = client.get_model_version_by_alias("tiny", "team")
        assert version.run_id == parent.info.run_id and version.description.startswith("Novella **tiny**")
        # the artifacts went through the server to its artifact root, and the rows are in PostgreSQL
        assert any((tmp_path / "artifacts").rglob("lineage.json"))
        import psycopg

        with psycopg.connect(db) as conn:  # the rows are in PostgreSQL itself
            assert conn.execute("select count(*) from runs").fetchone()[0] == 2
            assert conn.execute("select name from registered_models").fetchall() == [("tiny",)]
