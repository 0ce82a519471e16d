"""Sources on S3 (a moto server on 127.0.0.1): globs and prefixes, the same records, fingerprints and
line-numbered errors as local files, a copy reused while the ETag holds, and credentials never shown."""
from __future__ import annotations

import gzip
import json
import urllib.request

import pytest

from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzzzSECRET"


@pytest.fixture
def s3(monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")  # only ever this local server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFORGETESTKEY0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
    # moto keeps its buckets in this process across servers: each test starts from none
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).close()
    client.create_bucket(Bucket="acme")
    yield client
    server.stop()


def _lines(texts):
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def test_glob_prefix_and_formats_read_as_local_files(s3, tmp_path):
    s3.put_object(Bucket="acme", Key="crm/2024/a.jsonl", Body=_lines(["one", "two"]))
    s3.put_object(Bucket="acme", Key="crm/2024/b.jsonl.gz", Body=gzip.compress(_lines(["three"])))
    s3.put_object(Bucket="acme", Key="crm/2024/notes.bin", Body=b"\x00")
    s3.put_object(Bucket="acme", Key="crm/2025/c.jsonl", Body=_lines(["four"]))
    glob = resolve_source("crm", DataSource(path="s3://acme/crm/2024/*.jsonl"), tmp_path)
    assert [t for _, t in glob.records()] == ["one", "two"]
    prefix = resolve_source("crm", DataSource(path="s3://acme/crm"), tmp_path)  # every data file under it
    assert [t for _, t in prefix.records()] == ["one", "two", "three", "four"]
    local = tmp_path / "local" / "a.jsonl"
    local.parent.mkdir()
    local.write_bytes(_lines(["one", "two"]))
    assert glob.fingerprint() == resolve_source("crm", DataSource(path=str(local)), tmp_path).fingerprint()
    assert glob.splittable  # workers read byte ranges of the copy, as of a local file
    with pytest.raises(ForgeError, match=r"data.crm.path: no objects at 's3://acme/none/\*.jsonl'"):
        resolve_source("crm", DataSource(path="s3://acme/none/*.jsonl"), tmp_path)


def test_copies_are_reused_until_the_etag_changes(s3, tmp_path):
    s3.put_object(Bucket="acme", Key="d/a.jsonl", Body=_lines(["first"]))
    src = resolve_source("d", DataSource(path="s3://acme/d/a.jsonl"), tmp_path)
    before, copied = src.fingerprint(), src.files[0].stat().st_mtime_ns
    again = resolve_source("d", DataSource(path="s3://acme/d/a.jsonl"), tmp_path)
    assert again.files[0].stat().st_mtime_ns == copied  # not fetched again
    s3.put_object(Bucket="acme", Key="d/a.jsonl", Body=_lines(["changed"]))
    changed = resolve_source("d", DataSource(path="s3://acme/d/a.jsonl"), tmp_path)
    assert changed.fingerprint() != before and [t for _, t in changed.records()] == ["changed"]


def test_errors_name_the_object_and_line_and_never_the_credentials(s3, tmp_path):
    s3.put_object(Bucket="acme", Key="bad/x.jsonl", Body=_lines(["ok"]) + b"{broken\n")
    src = resolve_source("bad", DataSource(path="s3://acme/bad/x.jsonl"), tmp_path)
    with pytest.raises(ForgeError, match=r"s3/acme/bad/x.jsonl:line 2: malformed JSON"):
        list(src.records())
    with pytest.raises(ForgeError) as e:
        resolve_source("nb", DataSource(path="s3://no-such-bucket/x/*.jsonl"), tmp_path)
    assert "s3://no-such-bucket/x/*.jsonl: cannot list the objects" in str(e.value)
    assert SECRET not in str(e.value) and "AKIAFORGETESTKEY0000" not in str(e.value)
    assert not any(SECRET in p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())


def test_a_recipe_accepts_an_s3_path_without_looking_it_up(tmp_path):
    from forge.recipe.schema import Recipe

    r = Recipe.model_validate({"name": "r", "base": str(tmp_path), "output": str(tmp_path / "o"),
                               "data": {"crm": {"path": "s3://acme/crm/*.jsonl"}},
                               "stages": [{"kind": "pretrain", "name": "p", "mixture": {"crm": 1.0}, "max_steps": 1}],
                               "prepare": {"workers": 2}})
    assert r.data["crm"].path == "s3://acme/crm/*.jsonl" and r.prepare.processes == 2


def test_the_cleaned_cache_is_shared_through_s3(s3, tmp_path, capfd):
    from forge.data.hygiene import HygieneConfig
    from forge.data.parallel import PrepareConfig
    from forge.data.prepare import clean_sources

    s3.put_object(Bucket="acme", Key="crm/a.jsonl", Body=_lines(["mail ann@acme.com now", "same", "same"]))
    shared = PrepareConfig(workers=1, cache="s3://acme/prepared")
    one = {"crm": resolve_source("crm", DataSource(path="s3://acme/crm/a.jsonl"), tmp_path / "node0")}
    first, stats = clean_sources(HygieneConfig(), one, ["crm"], {"crm": one["crm"].fingerprint()}, tmp_path / "node0",
                                 shared)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="acme", Prefix="prepared/")["Contents"]]
    assert f"prepared/{first['crm'].files[0].parent.name}/stats.json" in keys
    # a second node with the same data and settings downloads it instead of cleaning again
    capfd.readouterr()
    two = {"crm": resolve_source("crm", DataSource(path="s3://acme/crm/a.jsonl"), tmp_path / "node1")}
    fetched, again = clean_sources(HygieneConfig(), two, ["crm"], {"crm": two["crm"].fingerprint()},
                                   tmp_path / "node1", PrepareConfig(workers=1, cache="s3://acme/prepared/"))
    assert fetched["crm"].files[0].read_bytes() == first["crm"].files[0].read_bytes() and again == stats
    assert [t for _, t in fetched["crm"].records()] == ["mail <EMAIL> now", "same"]
    err = capfd.readouterr().err
    assert "data: looking for the cleaned cache at s3://acme/prepared/clean-" in err and "data: cleaning" not in err
    with pytest.raises(ValueError, match="prepare.cache: must be an object-store prefix"):
        PrepareConfig(cache="/tmp/x")


# ------------------------------------------------------------------ keys that would leave the mirror
def _recipe(tmp_path, path, **prepare):
    from forge.recipe.schema import Recipe

    return Recipe.model_validate({"name": "r", "base": str(tmp_path / "base"), "output": str(tmp_path / "o"),
                                  "data": {"crm": {"path": path, "proprietary": True}},
                                  "stages": [{"kind": "pretrain", "name": "p", "mixture": {"crm": 1.0},
                                              "max_steps": 1}],
                                  "prepare": {"workers": 1, **prepare}})


def _files_outside(root, inside):
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.is_relative_to(inside))


def test_a_key_that_climbs_out_of_the_mirror_is_refused_on_the_path_forge_run_takes(s3, tmp_path):
    from forge.inputs import prepare_inputs

    key = "trav/../../../../../../../../outside.txt"  # eight levels up from the mirror's trav/ folder
    s3.put_object(Bucket="acme", Key="trav/good.txt", Body=b"fine\n")
    s3.put_object(Bucket="acme", Key=key, Body=b"planted\n")
    out = tmp_path / "a" / "b" / "c" / "run"  # deep enough that an escape would still land in tmp_path
    with pytest.raises(ForgeError) as e:
        prepare_inputs(_recipe(tmp_path, "s3://acme/trav"), out)
    assert f"s3://acme/{key}" in str(e.value) and "'..'" in str(e.value)
    assert _files_outside(tmp_path, out / "data" / "remote") == []


@pytest.mark.parametrize("key, why", [
    ("k/a/../b.jsonl", "'..'"),     # even one that would stay inside
    ("k/./x.jsonl", "'.'"),
    ("k/a//b.jsonl", "an empty segment"),
    ("k\\..\\x.jsonl", "a backslash"),
])
def test_keys_with_dot_segments_empty_segments_or_backslashes_are_refused(s3, tmp_path, key, why):
    s3.put_object(Bucket="acme", Key="k/fine.jsonl", Body=_lines(["ok"]))
    s3.put_object(Bucket="acme", Key=key, Body=_lines(["planted"]))
    with pytest.raises(ForgeError) as e:
        resolve_source("k", DataSource(path="s3://acme/k*"), tmp_path / "run")
    assert f"s3://acme/{key}" in str(e.value) and why in str(e.value)
    assert list((tmp_path / "run").rglob("*.jsonl")) == []  # nothing copied, the good object neither


def test_an_absolute_key_is_refused(s3, tmp_path):
    key = f"{tmp_path}/abs.jsonl"  # starts with '/': joined onto the mirror it would replace it
    s3.put_object(Bucket="acme", Key=key, Body=_lines(["planted"]))
    with pytest.raises(ForgeError) as e:
        resolve_source("abs", DataSource(path=f"s3://acme/{key}"), tmp_path / "run")
    assert f"s3://acme/{key}" in str(e.value) and "absolute" in str(e.value)
    assert _files_outside(tmp_path, tmp_path / "run") == []


def test_a_shared_cleaned_cache_with_a_climbing_key_is_refused(s3, tmp_path):
    from forge.data.objstore import get_dir
    from forge.inputs import prepare_inputs

    s3.put_object(Bucket="acme", Key="crm/a.jsonl", Body=_lines(["mail ann@acme.com now", "two"]))
    first = prepare_inputs(_recipe(tmp_path, "s3://acme/crm/a.jsonl", cache="s3://acme/prepared"), tmp_path / "n0")
    folder = first.sources["crm"].files[0].parent.name  # clean-<key>: what the second node looks for
    key = f"prepared/{folder}/../../../outside.txt"  # from n1/data/<folder>.fetch up to tmp_path
    s3.put_object(Bucket="acme", Key=key, Body=b"planted\n")
    with pytest.raises(ForgeError) as e:
        prepare_inputs(_recipe(tmp_path, "s3://acme/crm/a.jsonl", cache="s3://acme/prepared"), tmp_path / "n1")
    assert f"s3://acme/{key}" in str(e.value)
    assert _files_outside(tmp_path / "n1", tmp_path / "n1" / "data" / "remote") == []
    assert not (tmp_path / "outside.txt").exists()
    with pytest.raises(ForgeError, match="empty segment"):  # get_dir itself: the rest of the key is absolute
        s3.put_object(Bucket="acme", Key="p/x/stats.json", Body=b"{}")
        s3.put_object(Bucket="acme", Key=f"p/x/{tmp_path}/abs.txt", Body=b"planted")
        get_dir("s3://acme/p/x", tmp_path / "got", "stats.json")
    assert not (tmp_path / "abs.txt").exists() and not (tmp_path / "got").exists()
