"""Each training client an MLflow run in the serve config's experiment (forge.track): its base and
LoRA settings as params, loss and tokens of every optim_step as metrics at the step's number, the
checkpoints it saved; the run ends FINISHED with its session."""
from __future__ import annotations

import json

import pytest

from serving import KEY, config, serving, short_datum

tinker = pytest.importorskip("tinker")


def test_every_training_client_is_an_mlflow_run(tiny_checkpoint, tmp_path):
    from tinker import types

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"uri": uri, "experiment": "serve-clients"}
    with serving(config(tiny_checkpoint, tracking=tracking, checkpoint_dir=str(tmp_path / "ckpt"))) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
            d = short_datum()
            steps = []
            for _ in range(3):
                tc.forward_backward([d, d], "cross_entropy")
                steps.append(tc.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics)
            saved = tc.save_state("after-3").result().path
            other = sc.create_lora_training_client(base_model="tiny", rank=2, seed=1).result()
        finally:
            sc.close("success").result()

    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("serve-clients")
    runs = {r.data.tags["forge.serve.model_id"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {tc.model_id, other.model_id}
    run = runs[tc.model_id]
    assert run.info.status == "FINISHED"
    assert run.data.params["base_model"] == "tiny" and run.data.params["lora.rank"] == "4"
    assert run.data.params["lora.targets"].split(",")[:2] == ["q_proj", "k_proj"]
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in loss] == [(i + 1, pytest.approx(s["loss:sum"])) for i, s in enumerate(steps)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/tokens")] == [8.0] * 3
    assert run.data.tags["last_checkpoint"] == saved
    listed = json.loads(open(client.download_artifacts(run.info.run_id, "checkpoints.json", str(tmp_path))).read())
    assert listed["checkpoints"][0]["tinker_path"] == saved and listed["checkpoints"][0]["step"] == 3
    assert runs[other.model_id].data.params["lora.rank"] == "2"
