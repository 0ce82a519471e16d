"""Where `forge export --out` may write: a new folder, or with --overwrite one an earlier export
wrote (its marker checked). Everything else is refused in one line and left exactly as it was:
unrelated folders, run folders and Novellas and anything inside them, files, `.`, mount points,
symbolic links. A killed export leaves the earlier one intact and nothing beside it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from export_fixtures import save_tiny
from forge import cli
from forge_testing import REPO, refusal


def snapshot(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple]:
    """Every entry under `root` (not following links): kind, size, mtime, link target, content."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(dirpath) / name
            if any(p == s or s in p.parents for s in skip):
                continue
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(root))] = ("link", os.readlink(p))
            elif p.is_dir():
                out[str(p.relative_to(root))] = ("dir", st.st_mode)
            else:
                out[str(p.relative_to(root))] = ("file", st.st_size, st.st_mtime_ns, p.read_bytes()[:4096])
    return out


def export(*argv: str) -> tuple[int, str]:
    """`forge export` in this process: (exit code, stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = cli.main(["export", *argv])
    return code, err.getvalue()


@pytest.fixture
def model(tiny_checkpoint, tmp_path):
    return save_tiny("llama", tmp_path / "model", tiny_checkpoint)


def refused(model: Path, out: str | Path, root: Path, *flags: str, says: str) -> str:
    """Export to `out` is refused with one line containing `says`, and nothing under `root` changed."""
    before = snapshot(root)
    code, err = export(str(model), "--out", str(out), *flags)
    assert code == 2, err
    err = refusal(err)  # after the command's first line
    assert err.startswith("forge: error: ") and err.count("\n") == 1, err
    assert says in err, err
    assert "Traceback" not in err and "--resume" not in err and "unexpected error" not in err
    assert snapshot(root) == before
    return err


def test_an_unrelated_folder_is_never_replaced(model, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    for flags in ((), ("--overwrite",)):
        refused(model, mine, tmp_path, *flags, says="not written by forge export")
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_run_folders_novellas_and_their_insides_are_refused(model, tmp_path):
    run = tmp_path / "run"
    (run / "stages" / "cpt").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "x", "status": "finished"}))
    (run / "mlflow.db").write_bytes(b"SQLite format 3\x00")
    (run / "novella").mkdir()
    (run / "novella" / "lineage.json").write_text("{}")
    for out in (run, run / "stages", run / "mlflow.db", run / "new" / "deeper", run / "novella"):
        refused(model, out, tmp_path, "--overwrite", says="inside the forge run folder")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / ".forge.lock").write_text("")
    refused(model, locked / "export", tmp_path, says="inside the forge run folder")
    novella = tmp_path / "nov"
    novella.mkdir()
    (novella / "lineage.json").write_text("{}")
    refused(model, novella / "export", tmp_path, says="inside the Novella")
    assert not (run / "mlflow.db.old").exists()


def test_a_file_is_never_renamed_or_replaced(model, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    refused(model, notes, tmp_path, "--overwrite", says="is a file")
    refused(model, notes / "sub", tmp_path, says="is a file")
    assert notes.read_text() == "keep me" and not (tmp_path / "notes.txt.old").exists()


def test_current_directory_mount_point_and_links_are_refused(model, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    refused(model, ".", tmp_path, "--overwrite", says="the current directory")
    refused(model, "..", tmp_path, "--overwrite", says="the current directory")
    mount = next(p for p in ("/proc", "/sys", "/dev", "/") if os.path.ismount(p))
    refused(model, mount, tmp_path, "--overwrite", says="a mount point")
    assert export(str(model), "--out", str(tmp_path / "e"))[0] == 0
    (tmp_path / "link").symlink_to(tmp_path / "e")
    refused(model, tmp_path / "link", tmp_path, "--overwrite", says="a symbolic link")


def test_an_earlier_export_is_replaced_only_with_overwrite(model, tmp_path):
    out = tmp_path / "e"
    assert export(str(model), "--out", str(out))[0] == 0
    assert (out / ".forge-export").is_file()
    refused(model, out, tmp_path, says="add --overwrite")
    first = (out / "forge-manifest.json").read_text()
    time.sleep(1.1)  # the manifest's creation time is in seconds
    assert export(str(model), "--out", str(out), "--overwrite")[0] == 0
    assert (out / "forge-manifest.json").read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "model"]  # no .partial, .old or temp folder


def test_an_export_someone_added_to_or_a_faked_marker_is_refused(model, tmp_path):
    out = tmp_path / "e"
    assert export(str(model), "--out", str(out))[0] == 0
    (out / "my-notes.md").write_text("mine")
    refused(model, out, tmp_path, "--overwrite", says="my-notes.md")
    (out / "my-notes.md").unlink()
    (out / "forge-manifest.json").write_text("{}")
    refused(model, out, tmp_path, "--overwrite", says="marker")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / ".forge-export").write_text("{}")
    (fake / "data.csv").write_text("1,2")
    refused(model, fake, tmp_path, "--overwrite", says="not written by forge export")


# the child starts as a terminal's command would, whatever the runner ignores (a job started with
# nohup or `&` inherits SIGHUP or SIGINT ignored, and forge rightly leaves an ignored signal alone)
_CHILD = """
import pathlib, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
import safetensors.torch as st
real = st.save_file
def slow(tensors, filename, metadata=None):
    real(tensors, filename, metadata=metadata)
    pathlib.Path(sys.argv[1]).write_text("writing")
    time.sleep(600)
st.save_file = slow
from forge import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def _interrupted(model: Path, out: Path, ready: Path, sig: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ready), "export", str(model), "--out", str(out),
                             "--overwrite", "--max-shard-size", "20000"], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the export never started writing"
            time.sleep(0.2)
        proc.send_signal(sig)
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_an_interrupted_export_leaves_the_earlier_one_and_nothing_beside_it(model, tmp_path, sig):
    out = tmp_path / "exports" / "e"
    assert export(str(model), "--out", str(out))[0] == 0
    before = snapshot(tmp_path)
    code = _interrupted(model, out, tmp_path / "ready", sig)
    assert code != 0
    (tmp_path / "ready").unlink()
    if sig == signal.SIGKILL:  # nothing can clean up after SIGKILL: the next export does
        assert snapshot(tmp_path, skip=tuple((tmp_path / "exports").glob(".e.*"))) == before
        assert export(str(model), "--out", str(out), "--overwrite")[0] == 0
        assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == ["e"]
    else:
        assert snapshot(tmp_path) == before  # the earlier export intact, no .partial, no temp folder


@pytest.mark.parametrize("command", ["export", "deploy"])
def test_export_and_deploy_errors_do_not_suggest_resume(command, monkeypatch, capsys):
    import errno

    from forge.export import command as export_command

    def readonly(args):
        raise OSError(errno.EROFS, "Read-only file system", "/exports/e")

    monkeypatch.setattr(export_command, f"run_{command}", readonly)
    argv = ["export", "src", "--out", "e"] if command == "export" else \
        ["deploy", "e", "--s3-uri", "s3://b/p", "--role-arn", "arn:aws:iam::123456789012:role/R"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == "forge: error: /exports/e: Read-only file system\n"


@pytest.mark.slow
def test_a_fifo_named_like_the_weights_is_refused_not_waited_on(model, tmp_path):
    """safetensors would block on a FIFO until a writer came: the export names it and stops."""
    weights = model / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    # a subprocess, so that a hang ends the test at its timeout instead of blocking the suite
    proc = subprocess.run([sys.executable, "-m", "forge.cli", "export", str(model), "--out", str(tmp_path / "e")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "model.safetensors: not a regular file" in proc.stderr
    assert "unexpected error" not in proc.stderr and not (tmp_path / "e").exists()


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/outside.safetensors", "a/../../x.safetensors"])
def test_an_index_naming_a_shard_outside_the_folder_is_refused(model, tmp_path, shard):
    """A crafted index must not make forge read (and export) weights from elsewhere."""
    from forge.base_check import check_base

    index = {"metadata": {}, "weight_map": {"lm_head.weight": shard}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any("outside the folder" in p and repr(shard) in p for p in check_base(model))
    refused(model, tmp_path / "e", tmp_path, says="outside the folder")
