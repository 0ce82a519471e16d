"""Data preparation on a Ray cluster (prepare: {engine: ray}): a real two-node cluster on 127.0.0.1 (one
CPU a node, started and stopped here) runs hygiene and tokenization, and the kept records, the cleaned
cache, the counts and the token ids are byte for byte those of the local engine. Without Ray
installed, engine: ray is a one-line error naming prepare.engine and the install command."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from forge.data import parallel, ray_engine
from forge.data.cleanshards import clean_in_shards
from forge.data.hygiene import HygieneConfig
from forge.data.parallel import Engine, PrepareConfig, RayConfig, use_engine
from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource

WORDS = [f"w{i}" for i in range(40)] + ["pump", "valve", "ticket", "reset"]


def test_engine_ray_without_ray_installed_names_the_field_and_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    with pytest.raises(ForgeError) as e:
        PrepareConfig(engine="ray")
    assert str(e.value) == "prepare.engine: ray needs Ray, which is not installed here: pip install 'forge[ray]'"


@pytest.mark.parametrize("error", ["AttributeError(\"module 'grpc' has no attribute 'aio'\")",
                                   "ImportError(\"cannot import name 'BaseModel' from 'pydantic'\")"])
def test_ray_installed_but_failing_on_import_is_one_line_naming_the_error(tmp_path, monkeypatch, error):
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(f"raise {error}\n")  # a broken install: found, fails to load
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    prepare = PrepareConfig(engine="ray", workers=2)  # Ray is installed: the recipe is accepted
    with pytest.raises(ForgeError) as e:
        with Engine(2, prepare) as engine:
            list(engine.map(abs, [1, 2], "a phase", 2))
    message = str(e.value)
    assert message.startswith("prepare.engine: ray: Ray is installed but importing it failed (") and "\n" not in message
    assert eval(error).__class__.__name__ + ": " + str(eval(error)) in message


def test_bad_ray_settings_name_the_field():
    with pytest.raises(ForgeError, match=r"prepare.ray.address: expected auto, ray://HOST:PORT or HOST:PORT"):
        RayConfig(address="not an address")
    with pytest.raises(ForgeError, match=r"prepare.ray: only with prepare.engine: ray"):
        PrepareConfig(ray=RayConfig())


def test_an_address_nothing_answers_on_is_one_line_not_minutes_of_retries():
    with socket.socket() as s:  # a port bound here but not listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(ForgeError, match=rf"prepare.ray.address: nothing answers at '{address}'"):
            ray_engine._check_reachable(address)


ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'forge[ray]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a second node on 127.0.0.1, one CPU each; every process they started is ended by
    its process group (theirs alone: never `ray stop`, which ends every Ray on the machine)."""
    base = tmp_path_factory.mktemp("ray")
    if len(str(base)) > 40:  # Ray's socket paths under its temp dir must stay under 107 characters
        base = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": ""}
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--object-store-memory", str(100 << 20),
              "--disable-usage-stats"]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    commands = [[ray_cli, "start", "--head", "--port", str(port), "--include-dashboard=false",
                 "--ray-client-server-port", str(_free_port()), "--temp-dir", str(base / "h")] + common,
                [ray_cli, "start", "--address", f"127.0.0.1:{port}", "--temp-dir", str(base / "w")] + common]
    groups = []
    try:
        for cmd in commands:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            groups.append(proc.pid)
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pgid in groups:
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(2)


def _docs(seed: int, n: int = 120) -> list[str]:
    """Fuzzed tickets with planted exact (whitespace-only) and near (one word) duplicates and PII."""
    rnd = random.Random(seed)
    docs: list[str] = []
    for i in range(n):
        kind = rnd.choice(["new", "new", "new", "exact", "near", "pii"])
        long = [d for d in docs if len(d.split()) >= 12]
        if kind == "exact" and docs:
            docs.append("  ".join(rnd.choice(docs).split(" ")))
        elif kind == "near" and long:
            toks = rnd.choice(long).split()
            toks[rnd.randrange(len(toks))] = rnd.choice(WORDS)
            docs.append(" ".join(toks))
        elif kind == "pii":
            docs.append(f"mail ann{i}@acme.com about " + " ".join(rnd.choices(WORDS, k=rnd.randint(3, 20))))
        else:
            docs.append(" ".join(rnd.choices(WORDS, k=rnd.randint(1, 40))))
    return docs


def _write(folder: Path, name: str, docs: list[str], files: int) -> DataSource:
    (folder / name).mkdir(parents=True)
    per = -(-len(docs) // files)
    for f in range(files):
        (folder / name / f"{f}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                          for t in docs[f * per:(f + 1) * per]))
    return DataSource(path=str(folder / name))


def _clean(cfg, sources, folder: Path, engine: Engine):
    out, spill = folder / "out", folder / "spill"
    out.mkdir(parents=True)
    spill.mkdir()
    stats = clean_in_shards(cfg, sources, ["a", "b"], None, out, spill, engine)
    return {n: (out / f"{n}.jsonl").read_bytes() for n in ("a", "b")}, stats.as_dict()


@pytest.mark.slow
def test_hygiene_and_tokens_on_a_two_node_cluster_equal_the_local_engine(cluster, tmp_path, tiny_checkpoint,
                                                                           monkeypatch):
    from transformers import AutoTokenizer

    from forge.data.tokencache import token_cache

    monkeypatch.setattr(parallel, "SHARD_BYTES", 400)  # many shards: tasks on both nodes
    monkeypatch.setattr(parallel, "BATCH_CHARS", 400)
    docs = _docs(7)
    sources = {"a": resolve_source("a", _write(tmp_path / "in", "a", docs[:70], 2), tmp_path),
               "b": resolve_source("b", _write(tmp_path / "in", "b", docs[70:] + [docs[3]], 1), tmp_path)}
    cfg = HygieneConfig(num_perm=32, shingle_size=3)
    on_ray = PrepareConfig(engine="ray", ray=RayConfig(address=cluster))
    with Engine(1) as local:
        expected, expected_stats = _clean(cfg, sources, tmp_path / "local", local)
    with Engine(2, on_ray) as remote:
        cache, stats = _clean(cfg, sources, tmp_path / "ray", remote)
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2 and len(parallel.file_shards(sources["a"], 2)) > 4
    assert cache == expected and stats == expected_stats
    assert stats["hygiene.exact_dups"] >= 1 and stats["hygiene.near_dups"] >= 1 and stats["hygiene.pii.email"] >= 1
    assert b"<EMAIL>" in cache["a"] + cache["b"]

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    cleaned = resolve_source("c", DataSource(path=str(tmp_path / "ray" / "out" / "a.jsonl")), tmp_path)
    built = {}
    try:
        for name, prepare in (("local", PrepareConfig()), ("ray", on_ray)):
            use_engine(prepare)
            built[name] = token_cache(cleaned, tok, tmp_path / f"tok-{name}", 2).folder
    finally:
        use_engine(PrepareConfig())
    files = sorted(p.name for p in built["local"].iterdir())
    assert len([f for f in files if f.endswith(".ids.npy")]) > 1
    assert files == sorted(p.name for p in built["ray"].iterdir())
    for f in files:
        assert (built["ray"] / f).read_bytes() == (built["local"] / f).read_bytes(), f
    ids = np.load(built["ray"] / "0.ids.npy")
    assert ids.tolist()[:8] == tok(json.loads(cache["a"].decode().splitlines()[0])["text"])["input_ids"][:8]

