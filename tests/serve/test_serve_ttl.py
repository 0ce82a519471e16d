"""A checkpoint saved with ttl_seconds expires: listed with its expires_at until then, then neither
listed nor loaded, deleted on the server's worker, its name free again; one that expired while no
server ran is deleted when the next starts. The server's clock is driven by the test (no sleeping)."""
from __future__ import annotations

import datetime as dt

import pytest

from servers import poll
from serving import KEY, config, serving

tinker = pytest.importorskip("tinker")
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


@pytest.mark.slow
def test_a_checkpoint_saved_with_ttl_seconds_expires(tiny_checkpoint, tmp_path, monkeypatch):
    from forge.serve import checkpoints

    clock = [T0]
    cfg = config(tiny_checkpoint, checkpoint_dir=str(tmp_path / "ckpt"))
    with serving(cfg) as srv:
        store = srv.served.store
        store.clock = lambda: clock[0]
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        rest = tinker.RestClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
            kept = tc.save_state("kept").result().path
            short = tc.save_state("short", ttl_seconds=3600).result().path
            later = tc.save_weights_for_sampler("later", ttl_seconds=3 * 3600).result().path
            listed = {c.tinker_path: c.expires_at for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
            assert listed == {kept: None, short: T0 + HOUR, later: T0 + 3 * HOUR}
            with pytest.raises(tinker.UnprocessableEntityError, match="ttl_seconds"):
                tc.save_state("never", ttl_seconds=0).result()
            hence = checkpoints.Store(store.root, clock=lambda: T0 + 3 * HOUR)  # a listing deletes nothing itself
            assert [c["tinker_path"] for c in hence.listing(tc.model_id)] == [kept] and hence.expired_seen

            clock[0] = T0 + HOUR  # "short" expires
            with pytest.raises(tinker.NotFoundError, match=f"{short}: expired at 2030-01-01T01:00:00"):
                sc.create_training_client_from_state(short).result()
            folder = store.folder(checkpoints.parse(short))
            assert poll(lambda: not folder.exists(), 60)  # deleted on the worker
            listed = [c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints]
            assert listed == [kept, later]
            assert tc.save_state("short").result().path == short  # its name is free again, with no expiry
            assert store.folder(checkpoints.parse(later)).is_dir()
        finally:
            sc.close("success").result()

    # "later" expires while no server runs: the next one deletes it as it starts
    monkeypatch.setattr(checkpoints, "utcnow", lambda: T0 + 3 * HOUR)
    with serving(cfg) as srv:
        assert not srv.served.store.folder(checkpoints.parse(later)).exists()
        listed = tinker.RestClient(base_url=srv.url, api_key=KEY).list_checkpoints(tc.model_id).result()
        assert [(c.tinker_path, c.expires_at) for c in listed.checkpoints] == [(kept, None), (short, None)]
