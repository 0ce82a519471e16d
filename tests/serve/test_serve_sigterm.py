"""SIGTERM to a `forge serve` process while it writes a checkpoint: the server stops taking requests,
the save under way completes (never half of one under its name), the process exits 0 as on
Ctrl+C, and a server started again on the same checkpoint_dir lists and loads every checkpoint.

The save is held at a known point, not a timed one: the child runs through a launcher whose patch
stops save "b" after every file but its manifest is written, touches a marker file and waits until
the server has taken the signal."""
from __future__ import annotations

import signal

import pytest

from servers import poll
from serving import KEY, config, serving, serving_process, short_datum

tinker = pytest.importorskip("tinker")

HOLD = '''
import threading
from pathlib import Path

import uvicorn

from forge.serve import checkpoints

MARKER = Path({marker!r})
taken = threading.Event()  # the server has taken the signal
handle_exit, write_manifest = uvicorn.Server.handle_exit, checkpoints.files.write_manifest


def noted(self, sig, frame):
    handle_exit(self, sig, frame)
    taken.set()


def held(folder):
    if Path(folder).name == "b.partial":  # save "b": everything but the manifest is written
        MARKER.touch()
        taken.wait()
    write_manifest(folder)


uvicorn.Server.handle_exit = noted
checkpoints.files.write_manifest = held
'''


def _logprobs(tc) -> list[float]:
    return tc.forward([short_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()


@pytest.mark.slow
def test_sigterm_mid_save_leaves_every_checkpoint_whole_and_loadable(tiny_checkpoint, tmp_path):
    from tinker import types

    from forge.serve.checkpoints import Store, parse
    from forge.train.checkpoint import MANIFEST, verify_checkpoint

    store = Store(tmp_path / "ckpt")
    marker = tmp_path / "b-half-written"
    cfg = config(tiny_checkpoint, checkpoint_dir=str(store.root))
    with serving_process(cfg, tmp_path / "child", HOLD.format(marker=str(marker))) as child:
        sc = tinker.ServiceClient(base_url=child.url, api_key=KEY)
        tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=2).result()
        tc.forward_backward([short_datum()], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        before = _logprobs(tc)
        a = tc.save_state("a").result().path
        b = a.replace("/weights/a", "/weights/b")
        tc.save_state("b")  # never answered: the server stops while it writes
        assert poll(marker.exists, 120), child.output()
        half = store.folder(parse(b)).with_name("b.partial")
        assert (half / "adapter_model.safetensors").is_file() and not (half / MANIFEST).exists()
        assert not store.folder(parse(b)).exists()
        child.proc.send_signal(signal.SIGTERM)
        child.proc.wait(120)
        out = child.output()
    assert child.proc.returncode == 0, out
    assert "Shutting down" in out and f"save_weights {b}:" in out, out  # the save ran on to its end

    folder = store.folder(parse(b)).parent
    assert sorted(p.name for p in folder.iterdir()) == ["a", "b"], out  # no temporary folder left
    assert verify_checkpoint(store.folder(parse(a))) is None and verify_checkpoint(store.folder(parse(b))) is None
    with serving(cfg) as srv:  # the same checkpoint_dir, a new server
        listed = tinker.RestClient(base_url=srv.url, api_key=KEY).list_checkpoints(tc.model_id).result()
        assert [c.tinker_path for c in listed.checkpoints] == [a, b]
        sc2 = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            for path in (a, b):
                resumed = sc2.create_training_client_from_state_with_optimizer(path).result()
                assert _logprobs(resumed) == pytest.approx(before, abs=1e-6)
        finally:
            sc2.close("success").result()
