"""serve.yaml's `tracking.register: NAME`: each save_state (not sampler weights) a new version of
NAME in the tracking store's registry, logged on the client's MLflow run with the tinker path, the
training run, the step, the base and the lineage as tags and alias `candidate`; the version is the
adapter merged into its base, so `forge export models:/NAME/N` writes the same weights as an export
of the checkpoint folder. A bad name is refused at config check; a failed registration never fails
the save."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from serving import KEY, config, serving, short_datum

tinker = pytest.importorskip("tinker")


def _weights(folder):
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def test_a_saved_state_is_a_registered_version_forge_export_reads(tiny_checkpoint, tmp_path):
    import mlflow
    from tinker import types

    from forge import cli
    from forge.serve.checkpoints import parse

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"uri": uri, "experiment": "x", "register": "served"}
    with serving(config(tiny_checkpoint, tracking=tracking, checkpoint_dir=str(tmp_path / "ckpt"))) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            # train_unembed (the SDK's default) adapts the head the tiny base ties: the version is untied
            tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
            d = short_datum()
            tc.forward_backward([d], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            saved = tc.save_state("a").result()
            tc.save_weights_for_sampler("s").result()  # sampler weights: never registered
            folder = srv.served.store.folder(parse(saved.path))
        finally:
            sc.close("success").result()
    # the server stopped: every run ended once its records (the registration among them) were written

    assert saved.path.endswith("/weights/a")
    client = mlflow.MlflowClient(uri)
    assert [str(v.version) for v in client.search_model_versions("name = 'served'")] == ["1"]
    version = client.get_model_version("served", "1")
    tags = version.tags
    assert tags["forge.tinker_path"] == saved.path and tags["forge.training_run_id"] == tc.model_id
    assert tags["forge.step"] == "1" and tags["forge.base"] == str(tiny_checkpoint)
    lineage = json.loads(tags["forge.lineage"])
    assert lineage["stages"][0]["kind"] == "serve" and lineage["stages"][0]["output_checkpoint"] == saved.path
    assert str(client.get_model_version_by_alias("served", "candidate").version) == "1"
    run = client.get_run(version.run_id)
    assert run.data.tags["forge.serve.model_id"] == tc.model_id and run.info.status == "FINISHED"

    from forge.export.merged import write_merged
    from forge.track import fetch_registered_model

    # the version holds the merge in the trained precision (fp32), tensor for tensor
    registered = _weights(fetch_registered_model("models:/served/1", uri, tmp_path / "download")["folder"])
    merged = _weights(write_merged(folder, tmp_path / "merged"))
    assert registered.keys() == merged.keys() and all(torch.equal(registered[k], merged[k]) for k in merged)
    assert registered["lm_head.weight"].dtype == torch.float32

    by_registry, by_folder = tmp_path / "by-registry", tmp_path / "by-folder"
    assert cli.main(["export", "models:/served/1", "--tracking-uri", uri, "--out", str(by_registry),
                     "--format", "bedrock"]) == 0
    assert cli.main(["export", str(folder), "--out", str(by_folder), "--format", "bedrock"]) == 0
    manifest = json.loads((by_registry / "forge-manifest.json").read_text())
    assert manifest["source"]["versions"] == ["served/1"] and manifest["source"]["run_id"] == version.run_id
    assert manifest["lineage"]["stages"][0]["output_checkpoint"] == saved.path  # the version's own lineage
    assert json.loads((by_registry / "config.json").read_text())["tie_word_embeddings"] is False
    got, want = _weights(by_registry), _weights(by_folder)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_bad_registered_model_name_is_refused_naming_the_field(tiny_checkpoint, tmp_path):
    from forge.errors import ForgeError
    from forge.serve.config import load_config

    file = tmp_path / "serve.yaml"
    file.write_text(json.dumps(config(tiny_checkpoint, tracking={"uri": "sqlite:///x.db", "register": "my model"})))
    with pytest.raises(ForgeError, match=r"tracking\.register: 'my model' is not a registered model name"):
        load_config(file)


def test_a_failed_registration_is_logged_and_leaves_no_copy(tiny_checkpoint, tmp_path, caplog):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from forge.lineage import new_lineage
    from forge.serve import registration

    checkpoint = tmp_path / "weights" / "a"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_checkpoint),
                           LoraConfig(r=2, target_modules=["q_proj"]))
    model.peft_config["default"].base_model_name_or_path = str(tiny_checkpoint.resolve())
    model.save_pretrained(str(checkpoint))
    new_lineage("serve-a", str(tiny_checkpoint), tiny_checkpoint).write(checkpoint / "lineage.json")
    (checkpoint / "training_state.pt").write_bytes(b"moments")
    saved = registration.snapshot(checkpoint, tmp_path / "scratch", "tinker://r/weights/a", "r", 1)
    assert not (saved.copy / "training_state.pt").exists()  # the optimizer's moments are not copied
    merged = []

    class Failing:  # a store that fails as the version is logged
        def register_model(self, folder, *args, **kwargs):
            merged.append(sorted(p.name for p in folder.iterdir()))
            raise RuntimeError("the store is down")

    with caplog.at_level(logging.ERROR, logger="forge.serve"):
        assert registration.register(Failing(), "served", saved) is None
    assert "registering tinker://r/weights/a as served failed" in caplog.text and "the store is down" in caplog.text
    assert {"config.json", "model.safetensors", "lineage.json", "tokenizer.json"} <= set(merged[0])
    assert not any((tmp_path / "scratch").iterdir())
