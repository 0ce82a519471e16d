"""serve.yaml's checks, a catalog phase as a served base, and the `forge serve` command itself
(127.0.0.1 by default, the key required, Ctrl+C stops it, the key never printed)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from catalog_testing import write_tiny_foundation
from forge.errors import ForgeError
from forge.serve.config import load_config
from servers import ROOT, free_port, kill_tree, poll, spawn
from serving import KEY, config, serving, up

tinker = pytest.importorskip("tinker")


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize("change, said", [
    ({"api_keys": []}, "api_keys: at least one API key is required"),
    ({"api_keys": ["sk-live-secret-value"]}, "api_keys: every key must start with 'tml-'"),
    ({"models": [{"name": "a", "base": "/no/such/folder"}]}, "models[0].base: /no/such/folder is not a Hugging Face"),
    ({"models": [{"name": "a", "base": "catalog://no-such-family@x"}]}, "models[0].base:"),
    ({"precision": "fp8"}, "precision: Input should be 'fp32' or 'bf16'"),
    ({"lora_alpha": 0}, "lora_alpha: Input should be greater than 0"),
    ({"port": 80}, "port: Extra inputs are not permitted"),
])
def test_the_config_says_which_field_is_wrong(tmp_path, tiny_checkpoint, change, said):
    cfg = {**config(tiny_checkpoint), **change}
    with pytest.raises(ForgeError) as refused:
        load_config(_write(tmp_path, cfg))
    assert said in str(refused.value) and "sk-live-secret-value" not in str(refused.value)


def test_keys_may_come_from_the_environment_and_names_are_unique(tmp_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("SERVE_KEYS", f"{KEY}, tml-second")
    cfg = load_config(_write(tmp_path, {**config(tiny_checkpoint), "api_keys": [], "api_keys_env": "SERVE_KEYS"}))
    assert cfg.keys() == {KEY, "tml-second"}
    twice = config(tiny_checkpoint)
    twice["models"] *= 2
    with pytest.raises(ForgeError, match="models: model names must be unique; repeated: \\['tiny'\\]"):
        load_config(_write(tmp_path, twice))


def test_a_catalog_phase_is_a_served_base(tmp_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "home"))
    root = write_tiny_foundation(tmp_path / "home", tiny_checkpoint)
    ref = "catalog://forge-tiny@post-trained"
    with serving({"models": [{"name": "forge-tiny", "base": ref}], "api_keys": [KEY]}) as srv:
        caps = tinker.RestClient(base_url=srv.url, api_key=KEY).get_server_capabilities().result()
        assert [(m.model_name, m.max_context_length) for m in caps.supported_models] == [("forge-tiny", 128)]
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model=ref, rank=2, seed=0).result()  # the base itself names it
            assert tc.get_info().model_data.tokenizer_id == str(root / "post-trained")
            from tinker import types

            d = types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9]), loss_fn_inputs={"target_tokens": [5, 9, 2]})
            assert tc.forward([d], "cross_entropy").result().metrics["loss:sum"] > 0
        finally:
            sc.close("success").result()


def test_forge_serve_listens_on_this_machine_and_stops_on_ctrl_c(tmp_path, tiny_checkpoint):
    port = free_port()
    cfg = _write(tmp_path, config(tiny_checkpoint))
    proc = spawn([sys.executable, "-m", "forge.cli", "serve", "--config", cfg, "--port", str(port)], cwd=ROOT,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"

    try:
        assert poll(lambda: up(base, proc), 120) and proc.poll() is None, "forge serve did not start"
        assert httpx.get(f"{base}/api/v1/get_server_capabilities").status_code == 401
        caps = httpx.get(f"{base}/api/v1/get_server_capabilities", headers={"X-API-Key": KEY}).json()
        assert caps["supported_models"][0]["model_name"] == "tiny"
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and time.monotonic() - start < 60
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert out.startswith(f"forge serve: 1 base model(s) (tiny) on http://127.0.0.1:{port}\n"), out
    assert f"Uvicorn running on http://127.0.0.1:{port}" in out
    assert "GET /api/v1/get_server_capabilities HTTP/1.1\" 401" in out and KEY not in out


def test_the_first_line_comes_before_the_heavy_libraries(tmp_path, tiny_checkpoint):
    from test_cli_first_line import first_line

    got = first_line(["serve", "--config", _write(tmp_path, config(tiny_checkpoint))], tmp_path)
    assert got["line"] == "forge serve: 1 base model(s) (tiny) on http://127.0.0.1:8000" and got["heavy"] == []
