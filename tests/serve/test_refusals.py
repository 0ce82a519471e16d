"""What forge serve refuses, as the official SDK reports it, and that it goes on serving after: an
unknown or unsupported loss function (BadRequestError), a bad or missing API key
(AuthenticationError; the key never in the server's log), unsupported calls, bad datums, unknown
ids, another key's session."""
from __future__ import annotations

import logging
import time

import httpx
import pytest

from serving import KEY, config, datum, serving

tinker = pytest.importorskip("tinker")
WRONG = "tml-not-a-key-of-this-server-42"


def _datum(ids):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})


def test_unknown_losses_bad_data_and_unserved_calls_are_refused_and_serving_goes_on(tiny_checkpoint):
    from tinker import types

    with serving(config(tiny_checkpoint)) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
            good = [_datum([1, 5, 9, 17, 33, 65])]
            with pytest.raises(tinker.BadRequestError, match="'no_such_loss' is not a loss function forge serve knows"):
                tc.forward_backward(good, "no_such_loss").result()
            with pytest.raises(tinker.BadRequestError, match="'cispo' is unsupported by forge serve; served: "
                                                             "cross_entropy, importance_sampling, ppo"):
                tc.forward_backward(good, "cispo").result()
            with pytest.raises(tinker.BadRequestError, match=r"loss_fn_config \['clip_ratio'\]: ppo takes "
                                                             r"\['clip_high_threshold', 'clip_low_threshold'\]"):
                tc.forward_backward(good, "ppo", loss_fn_config={"clip_ratio": 0.2}).result()
            with pytest.raises(tinker.BadRequestError, match=r"importance_sampling takes target_tokens, logprobs, "
                                                             r"advantages; got \['target_tokens', 'weights'\]"):
                tc.forward_backward(good, "importance_sampling").result()
            with pytest.raises(tinker.BadRequestError, match=r"data\[0\].model_input: token ids must be in \[0, 384\)"):
                tc.forward_backward([_datum([1, 100000, 2])], "cross_entropy").result()
            with pytest.raises(tinker.BadRequestError, match="cross_entropy takes target_tokens"):
                tc.forward([types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                                        loss_fn_inputs={"advantages": [0.5, 0.5]})], "cross_entropy").result()
            with pytest.raises(tinker.BadRequestError, match="POST /api/v1/save_weights_external is unsupported by "
                                                             "forge serve"):
                tc.save_weights_external("step-1").result()
            with pytest.raises(tinker.BadRequestError, match="base_model 'Qwen/Qwen3-8B' is not served here; served: tiny"):
                sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2).result()
            # still serving: the same client trains on
            out = tc.forward_backward(good, "cross_entropy").result()
            assert out.metrics["loss:sum"] > 0 and len(out.loss_fn_outputs[0]["logprobs"].data) == 5
            assert tc.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm"] > 0
            unknown = httpx.post(f"{srv.url}/api/v1/retrieve_future", json={"request_id": "nope"},
                                 headers={"X-API-Key": KEY})
            assert unknown.status_code == 404 and "no such future" in unknown.json()["detail"]
        finally:
            sc.close("success").result()


def test_a_bad_or_missing_api_key_is_refused_with_the_sdks_error_and_never_logged(tiny_checkpoint, caplog):
    caplog.set_level(logging.DEBUG)
    with serving(config(tiny_checkpoint)) as srv:
        bad = tinker.ServiceClient(base_url=srv.url, api_key=WRONG)
        with pytest.raises(tinker.AuthenticationError) as refused:
            bad.create_lora_training_client(base_model="tiny", rank=2).result()
        assert refused.value.status_code == 401
        assert refused.value.body == {"detail": "missing or unknown API key: send a configured key in X-API-Key"}
        with pytest.raises(tinker.AuthenticationError):
            tinker.RestClient(base_url=srv.url, api_key=WRONG).get_server_capabilities().result()
        for headers in ({}, {"X-API-Key": ""}, {"X-API-Key": KEY + "x"}):
            answer = httpx.get(f"{srv.url}/api/v1/get_server_capabilities", headers=headers)
            assert answer.status_code == 401 and WRONG not in answer.text and KEY not in answer.text
        assert httpx.get(f"{srv.url}/api/v1/healthz").json() == {"status": "ok"}  # liveness needs no key
        # still serving the right key
        good = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = good.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
            assert tc.forward([_datum([1, 5, 9])], "cross_entropy").result().metrics["loss:sum"] > 0
        finally:
            good.close("success").result()
    logged = caplog.text
    assert "401" in logged and "/api/v1/client/config" in logged  # the refusals were logged ...
    assert WRONG not in logged and KEY not in logged               # ... without the keys


def test_sessions_heartbeat_and_one_silent_too_long_ends_and_frees_its_models(tiny_checkpoint):
    from tinker import types

    with serving(config(tiny_checkpoint, session_timeout_s=1.0)) as srv:
        auth = {"X-API-Key": KEY}
        body = types.CreateSessionRequest(tags=[], user_metadata=None, sdk_version=tinker.__version__)
        sid = httpx.post(f"{srv.url}/api/v1/create_session", json=body.model_dump(mode="json"), headers=auth).json()
        beat = httpx.post(f"{srv.url}/api/v1/session_heartbeat", headers=auth,
                          json=types.SessionHeartbeatRequest(session_id=sid["session_id"]).model_dump(mode="json"))
        assert beat.json() == {"type": "session_heartbeat"}
        unknown = httpx.post(f"{srv.url}/api/v1/session_heartbeat", json={"session_id": "nope"}, headers=auth)
        assert unknown.status_code == 404

        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)  # heartbeats every 10 s: too seldom here
        tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
        entry = srv.served.registry.models[tc.model_id]
        time.sleep(1.5)
        with pytest.raises(tinker.APIStatusError) as ended:
            tc.forward([_datum([1, 5, 9])], "cross_entropy").result()
        assert ended.value.status_code == 410 and "no heartbeat for 1 s" in ended.value.body["detail"]
        deadline = time.monotonic() + 30
        while entry.served is not None and time.monotonic() < deadline:  # released by the worker
            time.sleep(0.05)
        assert entry.served is None
        sc.close("success").result()


def test_datums_of_forge_examples_round_trip_through_the_sdks_proto(tiny_checkpoint):
    """The subset of the SDK's protobuf schema forge serve reads and writes, against the SDK's own
    encoder and decoder."""
    import numpy as np
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.proto.response_conv import deserialize_forward_backward_output

    from forge.serve import batch, proto
    from forge.serve.losses import LOSSES

    d = datum({"input_ids": [1, 7, 8, 9], "labels": [-100, -100, 8, 9]}, 0.5)
    req = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(data=[d, d], loss_fn="ppo"),
                                       model_id="m", seq_id=4)
    msg = proto.parse_request(forward_backward_request_to_proto(req).SerializeToString())
    assert (msg.model_id, msg.seq_id, msg.loss_fn, len(msg.data)) == ("m", 4, "ppo", 2)
    ce = LOSSES["cross_entropy"]
    [first, _] = batch.examples(msg, batch.Limits(vocab=10, context=None), ce, {})
    assert first.tokens.tolist() == [1, 7, 8] and first.targets.tolist() == [7, 8, 9]
    assert first.inputs["weights"].tolist() == [0.0, 0.5, 0.5]
    with pytest.raises(Exception, match="exceed the model's context of 2"):
        batch.examples(msg, batch.Limits(vocab=10, context=2), ce, {})
    out = deserialize_forward_backward_output(proto.encode_output(
        {"logprobs": [np.array([-1.0, -2.0]), np.array([-3.0])]}, {"loss:sum": 6.0}))
    assert out.metrics == {"loss:sum": 6.0}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]


def test_a_base_that_fails_to_load_fails_its_future_and_the_server_serves_on(tiny_checkpoint, tmp_path):
    from catalog_testing import write_header_only_checkpoint

    broken = write_header_only_checkpoint(tmp_path / "broken")  # a config.json, no real weights
    cfg = config(tiny_checkpoint)
    cfg["models"].append({"name": "broken", "base": str(broken)})
    with serving(cfg) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            with pytest.raises(tinker.RequestFailedError, match="Request failed: RuntimeError: base .broken. .* did not load"):
                sc.create_lora_training_client(base_model="broken", rank=2).result()
            [entry] = [e for e in srv.served.registry.models.values() if e.spec.name == "broken"]
            info = httpx.post(f"{srv.url}/api/v1/get_info", json={"model_id": entry.id}, headers={"X-API-Key": KEY})
            assert info.status_code == 400 and "create_model failed" in info.json()["detail"]
            tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
            assert tc.forward([_datum([1, 5, 9])], "cross_entropy").result().metrics["loss:sum"] > 0
        finally:
            sc.close("success").result()
