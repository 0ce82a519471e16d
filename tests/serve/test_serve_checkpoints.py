"""Checkpoints through the official SDK and tinker-cookbook's checkpoint_utils: save_state +
save_weights_for_sampler (kind="both"), then a new client resumed from the state with its optimizer
trains on to the same weights as the client that never stopped; the REST client's listings; another
API key's paths refused; a killed save leaves no checkpoint; the folder is a forge checkpoint that
`forge eval` loads and `forge export` merges."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import pytest
import torch

from servers import ROOT
from serving import KEY, OTHER_KEY, config, datum, max_difference, serving, sft_tokens, short_datum, trainable

tinker = pytest.importorskip("tinker")
checkpoint_utils = pytest.importorskip("tinker_cookbook.checkpoint_utils")  # .ci/run installs it
STEPS, LR = 3, 1e-2


def _steps(tc, data, n):
    from tinker import types

    losses = []
    for _ in range(n):
        fwd = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=LR, weight_decay=0.01, grad_clip_norm=1.0)).result()
        losses.append(fwd.result().metrics["loss:sum"])
    return losses


def test_a_client_resumed_from_a_checkpoint_trains_on_as_the_one_that_never_stopped(tiny_checkpoint, tmp_path):
    from tinker import types

    log = tmp_path / "log"
    log.mkdir()
    with serving(config(tiny_checkpoint, checkpoint_dir=str(tmp_path / "ckpt"))) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
        examples = sft_tokens(tc.get_tokenizer(), 5, 120)
        data = [datum(e, 0.01) for e in examples]
        _steps(tc, data, STEPS)
        mid = trainable(srv.model(tc.model_id))
        paths = checkpoint_utils.save_checkpoint(training_client=tc, name=f"{STEPS:06d}", log_path=str(log),
                                                 loop_state={"batch": STEPS}, kind="both")
        on = _steps(tc, data, STEPS)
        kept_on = trainable(srv.model(tc.model_id))
        rest = tinker.RestClient(base_url=srv.url, api_key=KEY)
        listed = rest.list_checkpoints(tc.model_id).result().checkpoints
        assert sorted((c.checkpoint_id, c.checkpoint_type) for c in listed) == [
            ("sampler_weights/000003", "sampler"), ("weights/000003", "training")]
        assert {c.tinker_path for c in listed} == set(paths.values())
        run = rest.get_training_run(tc.model_id).result()
        assert (run.base_model, run.lora_rank, run.last_checkpoint.tinker_path) == ("tiny", 4, paths["state_path"])
        sc.close("success").result()

        # a new client (a new ServiceClient, the same key) resumes where the cookbook's log says
        resume = checkpoint_utils.get_last_checkpoint(str(log))
        assert resume.batch == STEPS and resume.state_path == paths["state_path"]
        sc2 = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc2 = sc2.create_training_client_from_state_with_optimizer(resume.state_path).result()
            assert tc2.model_id != tc.model_id and tc2.get_info().lora_rank == 4
            assert max_difference(trainable(srv.model(tc2.model_id)), mid) == 0.0
            resumed = _steps(tc2, data, STEPS)
            again = trainable(srv.model(tc2.model_id))
            fresh = sc2.create_training_client_from_state(resume.state_path).result()  # weights only: new moments
            assert max_difference(trainable(srv.model(fresh.model_id)), mid) == 0.0
            _steps(fresh, data, 1)
            sampler = sc2.create_sampling_client(model_path=resume.sampler_path).result()
            assert len(sampler.sample(types.ModelInput.from_ints([1, 5, 9]), 1,
                                      types.SamplingParams(max_tokens=3)).result().sequences[0].tokens) == 3
            runs = tinker.RestClient(base_url=srv.url, api_key=KEY).list_training_runs().result()
            assert {r.training_run_id for r in runs.training_runs} == {tc.model_id, tc2.model_id, fresh.model_id}
        finally:
            sc2.close("success").result()

    worst = max_difference(again, kept_on)
    moved = max_difference(kept_on, mid)
    print(f"forge serve resume: {STEPS} steps on from the checkpoint, max |weight difference| resumed vs "
          f"continued {worst:.3g} (the steps moved the weights {moved:.3g}); losses {on} vs {resumed}")
    assert moved > 1e-3 and worst <= 1e-6
    assert resumed == pytest.approx(on, rel=1e-6)


def test_another_keys_paths_are_refused_and_a_killed_save_leaves_no_checkpoint(tiny_checkpoint, tmp_path,
                                                                               monkeypatch):
    from tinker import types

    from forge.serve import checkpoints

    with serving(config(tiny_checkpoint, checkpoint_dir=str(tmp_path / "ckpt"))) as srv:
        mine, theirs = (tinker.ServiceClient(base_url=srv.url, api_key=k) for k in (KEY, OTHER_KEY))
        try:
            tc = mine.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
            state = tc.save_state("kept").result().path
            sampler_path = tc.save_weights_for_sampler("kept").result().path
            for call in (lambda: theirs.create_training_client_from_state(state).result(),
                         lambda: theirs.create_sampling_client(model_path=sampler_path).result(),
                         lambda: tinker.RestClient(base_url=srv.url, api_key=OTHER_KEY).list_checkpoints(
                             tc.model_id).result(),
                         lambda: tinker.RestClient(base_url=srv.url, api_key=OTHER_KEY).get_weights_info_by_tinker_path(
                             state).result()):
                with pytest.raises(tinker.PermissionDeniedError, match="belongs to another client's training run"):
                    call()
            answer = httpx.post(f"{srv.url}/api/v1/get_info", json={"model_id": tc.model_id},
                                headers={"X-API-Key": OTHER_KEY})  # another key's model, by its id
            assert answer.status_code == 403 and "belongs to another API key's client" in answer.json()["detail"]
            assert tinker.RestClient(base_url=srv.url, api_key=OTHER_KEY).list_training_runs().result() \
                .training_runs == []
            with pytest.raises(tinker.BadRequestError, match="path '../x': a checkpoint name is"):
                tc.save_state("../x").result()
            with pytest.raises(tinker.RequestFailedError, match=f"checkpoint {state} exists; save_state"):
                tc.save_state("kept").result()
            assert tc.save_state("kept", overwrite=True).result().path == state

            # a save killed half-way (here: the disk fails after the adapter is written) leaves nothing
            def dies(*args, **kwargs):
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(checkpoints.files, "write_manifest", dies)
            with pytest.raises(tinker.RequestFailedError, match="cannot write checkpoint .*/weights/half .*No space left"):
                tc.save_state("half").result()
            monkeypatch.undo()
            folder = srv.served.store.folder(checkpoints.parse(state)).parent
            (folder / "other.partial").mkdir()  # what a SIGKILL mid-write leaves: never a checkpoint
            (folder / "other.partial" / "forge_state.json").write_text("{}")
            listed = tinker.RestClient(base_url=srv.url, api_key=KEY).list_checkpoints(tc.model_id).result()
            assert sorted(c.checkpoint_id for c in listed.checkpoints) == ["sampler_weights/kept", "weights/kept"]
            assert not (folder / "half").exists() and not (folder / "half.partial").exists()
            tc.forward_backward([types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                                             loss_fn_inputs={"target_tokens": [2, 3]})], "cross_entropy")
            assert tc.optim_step(types.AdamParams()).result().metrics["grad_norm"] > 0  # serving goes on
        finally:
            mine.close("success").result()
            theirs.close("success").result()


@pytest.mark.slow
def test_a_saved_checkpoint_is_a_forge_checkpoint_forge_eval_and_export_accept(tiny_checkpoint, tmp_path):
    from tinker import types

    from forge.lineage import Lineage
    from forge.serve.checkpoints import parse
    from forge.train.checkpoint import verify_checkpoint

    with serving(config(tiny_checkpoint, checkpoint_dir=str(tmp_path / "ckpt"))) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            # train_unembed (the SDK's default) adapts the head the tiny base ties to its embeddings
            tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=1).result()
            d = short_datum()
            for _ in range(3):  # small steps: a random tiny model with large adapters amplifies bf16 rounding
                tc.forward_backward([d], "cross_entropy")
                tc.optim_step(types.AdamParams(learning_rate=2e-3)).result()
            path = tc.save_state("final").result().path
            folder = srv.served.store.folder(parse(path))
            ids = torch.tensor([[1, 5, 9, 17]])
            want = srv.model(tc.model_id)(input_ids=ids).logits.detach()
        finally:
            sc.close("success").result()

    assert verify_checkpoint(folder) is None
    lineage = Lineage.read(folder / "lineage.json")
    assert lineage.base.spec == str(tiny_checkpoint) and lineage.stages[0].kind == "serve"
    assert lineage.stages[0].steps == 3 and lineage.stages[0].output_checkpoint == path
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str(tiny_checkpoint.resolve())

    from forge.eval.suite import load

    model, _ = load(folder, "cpu")  # what forge eval loads: the base with the adapter
    assert torch.allclose(model(input_ids=ids).logits, want, atol=1e-5)

    out = tmp_path / "export"
    done = subprocess.run([sys.executable, "-m", "forge.cli", "export", str(folder), "--out", str(out), "--format",
                           "bedrock", "--dtype", "bf16", "--verify"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((out / "forge-manifest.json").read_text())
    assert manifest["source"]["lora_base"] == str(tiny_checkpoint.resolve())
    assert manifest["lineage"]["stages"][0]["kind"] == "serve"
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False  # the head untied
    shutil.rmtree(out)
