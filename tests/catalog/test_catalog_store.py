"""`forge catalog add` / `remove` against hostile input and concurrency: parallel adds all land
(the catalog file is changed under a lock), a FIFO or a crafted safetensors header is one line
and never a hang or a MemoryError, a corrupted or misplaced catalog.yaml is one line naming the key,
names are strict slugs, and a registered folder that was deleted is said to be missing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from catalog_testing import write_header_only_checkpoint
from forge import catalog
from forge.cli import main
from forge.errors import ForgeError
from forge_testing import REPO, pretrain_stage, write_recipe


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))
    return tmp_path / "forge-home"


def _forge(*argv: str, cwd, home, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FORGE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "forge.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _one_line_error(capsys, *argv: str) -> str:
    """Run `forge ARGV`, expecting exit 2 and one `forge: error:` line; return that line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("forge: error: ") and "\n" not in err and "unexpected" not in err, err
    return err


@pytest.mark.slow
def test_twelve_parallel_adds_all_land(tmp_path, home):
    ckpt = write_header_only_checkpoint(tmp_path / "ckpt")
    procs = [subprocess.Popen([sys.executable, "-m", "forge.cli", "catalog", "add", f"acme@p{i}", str(ckpt),
                               "--point", "pretrained"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "FORGE_HOME": str(home)})
             for i in range(12)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    assert all(rc == 0 for rc, _ in results), results
    saved = yaml.safe_load((home / "catalog.yaml").read_text())
    assert sorted(saved["families"]["acme"]["phases"]) == sorted(f"p{i}" for i in range(12))
    assert not [p.name for p in home.iterdir() if p.name.endswith(".tmp") or ".tmp" in p.name]


def test_a_fifo_named_model_safetensors_is_refused_not_waited_on(tmp_path, home):
    ckpt = write_header_only_checkpoint(tmp_path / "ckpt", weights=False)
    os.mkfifo(ckpt / "model.safetensors")
    done = _forge("catalog", "add", "acme@pretrained", str(ckpt), cwd=tmp_path, home=home, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "model.safetensors" in lines[0] and "not a regular file" in lines[0], lines
    assert not (home / "catalog.yaml").exists()


@pytest.mark.parametrize("length", [2 ** 60, 5000])
def test_a_crafted_safetensors_header_length_is_one_line(tmp_path, capsys, length):
    ckpt = write_header_only_checkpoint(tmp_path / "ckpt", header_length=length)
    err = _one_line_error(capsys, "catalog", "add", "acme@pretrained", str(ckpt))
    assert f"model.safetensors is truncated or not safetensors (header says {length} bytes" in err
    assert catalog.entries.local_facts(ckpt)["parameters"] is None  # the header is never read past the file


def test_a_symlink_loop_given_as_the_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    err = _one_line_error(capsys, "catalog", "add", "acme@pretrained", str(tmp_path / "a"))
    assert str(tmp_path / "a") in err and "symlink loop" in err


@pytest.mark.parametrize("spec", ["acme\n@pretrained", "acme@pretrained\n", "ac me@pretrained", "acme@Pre",
                                  "x" * 65 + "@pretrained"])
def test_family_and_phase_names_are_strict_slugs(tmp_path, home, capsys, spec):
    ckpt = write_header_only_checkpoint(tmp_path / "ckpt")
    err = _one_line_error(capsys, "catalog", "add", spec, str(ckpt), "--point", "pretrained")
    assert repr(spec) in err and "expected FAMILY@PHASE" in err, err
    assert not (home / "catalog.yaml").exists()


def _registered(home, families) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.yaml").write_text(yaml.safe_dump({"families": families}))


GOOD = {"point": "pretrained", "path": "/nowhere"}


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe\x00binary\x80", ["not readable YAML"]),
    ([1, 2], ["expected a mapping 'families:'"]),
    ({"acme": "x"}, ["families.acme", "expected a mapping"]),
    ({"acme": {"phases": ["pretrained"]}}, ["families.acme.phases", "expected a mapping"]),
    ({"acme": {"phases": {"pretrained": "x"}}}, ["families.acme.phases.pretrained", "expected a mapping"]),
    ({"acme": {"phases": {"pretrained": {**GOOD, "point": 7}}}}, ["families.acme.phases.pretrained.point", "7"]),
    ({"acme": {"phases": {"pretrained": {**GOOD, "path": 12}}}}, ["families.acme.phases.pretrained.path"]),
    ({"acme": {"phases": {"pretrained": {"point": "pretrained"}}}}, ["families.acme.phases.pretrained", "path"]),
    ({"acme": {"phases": {"pretrained": {**GOOD, "parameters": "many"}}}},
     ["families.acme.phases.pretrained.parameters"]),
    ({"acme": {"phases": {"pretrained": {**GOOD, "curated": "web"}}}}, ["families.acme.phases.pretrained.curated"]),
    ({"acme": {"phases": {"pretrained": {**GOOD, "registered_from": ["x"]}}}},
     ["families.acme.phases.pretrained.registered_from"]),
    ({"acme\n": {"phases": {"pretrained": GOOD}}}, ["families", "'acme\\n'", "not a family name"]),
    ({"acme": {"phases": {"pre trained": GOOD}}}, ["families.acme.phases", "'pre trained'", "not a phase name"]),
])
def test_a_corrupted_catalog_yaml_is_one_line_naming_the_key(home, capsys, content, words):
    home.mkdir(parents=True)
    path = home / "catalog.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict):
        _registered(home, content)
    else:
        path.write_text(yaml.safe_dump(content))
    err = _one_line_error(capsys, "catalog", "list")
    assert str(path) in err and all(w in err for w in words), err


def test_a_catalog_yaml_that_is_a_directory_is_refused_and_nothing_is_left_beside_it(tmp_path, home, capsys):
    ckpt = write_header_only_checkpoint(tmp_path / "ckpt")
    (home / "catalog.yaml").mkdir(parents=True)
    err = _one_line_error(capsys, "catalog", "add", "acme@pretrained", str(ckpt))
    assert f"{home / 'catalog.yaml'}: not a regular file" in err
    assert sorted(p.name for p in home.iterdir()) in (["catalog.yaml"], ["catalog.yaml", "catalog.yaml.lock"])
    assert not any((home / "catalog.yaml").iterdir())


def test_a_registered_phase_whose_folder_was_deleted_is_named_missing(tmp_path, home, capsys):
    import shutil

    ckpt = write_header_only_checkpoint(tmp_path / "ckpt")
    catalog.add("acme@mid-trained", ckpt)
    shutil.rmtree(ckpt)
    recipe = write_recipe(tmp_path / "r.yaml", {
        "name": "cat", "base": "catalog://acme@mid-trained",
        "data": {"kb": {"generate": {"kind": "facts", "documents": 200, "seed": 1}, "proprietary": True}},
        "stages": [pretrain_stage(mixture={"kb": 1.0}, max_steps=3)], "output": str(tmp_path / "out")})
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"the registered folder {ckpt} of catalog entry acme@mid-trained ({home / 'catalog.yaml'}) is missing" \
        in err, err
    assert "hf://None" not in err
    with pytest.raises(ForgeError) as e:
        catalog.planning_config("catalog://acme@mid-trained")
    assert f"the registered folder {ckpt}" in str(e.value) and "hf://None" not in str(e.value)
