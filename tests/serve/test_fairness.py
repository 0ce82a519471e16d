"""Several clients at once: the worker takes their calls round-robin (a client with many queued
calls delays another's next call by one call), and two clients training at once on one base end
with the very weights, losses and samples each gets alone: nothing of one client's state reaches
the other's."""
from __future__ import annotations

import threading

import pytest

from forge.serve.worker import Worker
from serving import KEY, OTHER_KEY, config, max_difference, serving, trainable

tinker = pytest.importorskip("tinker")


def test_the_worker_takes_the_clients_calls_round_robin():
    worker, ran, gate = Worker(), [], threading.Event()

    def call(name):
        def run():
            if name == "a0":
                gate.wait(10)  # hold the worker while the others queue
            ran.append(name)
            return {}
        return run

    worker.start()
    try:
        first = worker.submit("a0", call("a0"), lane="a")
        while worker.queued():  # a0 is running
            pass
        ids = [worker.submit(n, call(n), lane=n[0]) for n in ("a1", "a2", "a3", "b0", "b1", "c0")]
        gate.set()
        for rid in [first, *ids]:
            worker.future(rid).result(10)
    finally:
        worker.stop()
    assert ran == ["a0", "a1", "b0", "c0", "a2", "b1", "a3"]


def _train(url: str, key: str, seed: int, tokens: list[int], out: dict) -> None:
    """A short client session: three steps, then a sample of its weights."""
    from tinker import types

    sc = tinker.ServiceClient(base_url=url, api_key=key)
    try:
        tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=seed).result()
        d = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:]})
        losses = []
        for _ in range(3):
            fwd = tc.forward_backward([d, d], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=0.02))
            losses.append(fwd.result().metrics["loss:sum"])
        sampler = tc.save_weights_and_get_sampling_client().result()
        drawn = sampler.sample(types.ModelInput.from_ints(tokens[:3]), 2, types.SamplingParams(max_tokens=4, seed=5))
        out.update(model_id=tc.model_id, losses=losses, samples=[s.tokens for s in drawn.result().sequences])
        out["weights"] = out["model"](tc.model_id)
    finally:
        sc.close("success").result()


def test_two_clients_at_once_on_one_base_get_what_each_gets_alone(tiny_checkpoint, caplog):
    import logging

    plans = {"a": (KEY, 1, [1, 5, 9, 17, 33, 65]), "b": (OTHER_KEY, 2, [2, 7, 11, 13, 19, 23, 29])}
    with serving(config(tiny_checkpoint)) as srv:
        def weights(model_id):
            return trainable(srv.model(model_id))

        alone = {}
        for name, (key, seed, tokens) in plans.items():
            alone[name] = {"model": weights}
            _train(srv.url, key, seed, tokens, alone[name])
        together = {name: {"model": weights} for name in plans}
        caplog.set_level(logging.INFO, logger="forge.serve")
        caplog.clear()
        threads = [threading.Thread(target=_train, args=(srv.url, *plans[n], together[n])) for n in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for name in plans:
        assert together[name]["losses"] == alone[name]["losses"], name
        assert together[name]["samples"] == alone[name]["samples"], name
        assert max_difference(together[name]["weights"], alone[name]["weights"]) == 0.0, name
    assert alone["a"]["losses"] != alone["b"]["losses"]
    ran = [m.split(":")[0] for r in caplog.records for m in [r.getMessage().split(" ", 1)[1]]
           if r.getMessage().startswith(("forward_backward", "optim_step"))]
    sessions = [s for s in ran if s]
    switches = sum(a != b for a, b in zip(sessions, sessions[1:]))
    assert switches >= 3, sessions  # the clients' calls ran interleaved, not one client's after the other's
