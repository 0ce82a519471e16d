"""forge launch --out: a new (or empty) folder, or one an earlier forge launch wrote and nobody has
changed since; anything else is refused in one line with nothing written: a user's own files, a
symbolic link (the folder or a file in it), an empty name, the current folder, a file. A refused
or failed launch leaves the folder as it was; a relaunch replaces a forge launch folder whole."""
import os

import pytest

from forge.cli import main
from forge_testing import base_recipe, write_recipe


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("out")
    return write_recipe(tmp / "r.yaml", base_recipe(tmp))


def launch(recipe, out, engine="torchrun", target="local") -> int:
    return main(["launch", str(recipe), "--engine", engine, "--target", target, "--out", str(out)])


def refused(capsys, says: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("forge: error: --out ") and says in err[-1], err


def test_a_new_folder_gets_the_job_and_a_relaunch_replaces_it_whole(recipe, tmp_path):
    out = tmp_path / "jobs" / "acme"
    assert launch(recipe, out, "torchrun", "h100:16") == 0
    assert {p.name for p in out.iterdir()} == {"torchrun.sh", "accelerate.yaml", "launch.json", ".forge-launch"}
    assert launch(recipe, out, "slurm", "p5.48xlarge") == 0  # another engine: the old files go
    assert {p.name for p in out.iterdir()} == {"forge.sbatch", "launch.json", ".forge-launch"}
    assert os.access(out / "forge.sbatch", os.X_OK)
    assert [p.name for p in tmp_path.joinpath("jobs").iterdir()] == ["acme"]  # nothing left beside it


def test_an_empty_folder_is_used(recipe, tmp_path):
    assert launch(recipe, tmp_path) == 0
    assert (tmp_path / "torchrun.sh").is_file()


@pytest.mark.parametrize("own", ["launch.json", "torchrun.sh", "notes.txt"])
def test_a_users_own_file_is_never_replaced(recipe, tmp_path, capsys, own):
    out = tmp_path / "job"
    out.mkdir()
    (out / own).write_text("mine\n")
    assert launch(recipe, out) == 2
    refused(capsys, f"holds {own}, which forge launch did not write")
    assert [p.name for p in out.iterdir()] == [own] and (out / own).read_text() == "mine\n"


def test_a_script_edited_since_forge_wrote_it_is_not_replaced(recipe, tmp_path, capsys):
    out = tmp_path / "job"
    assert launch(recipe, out) == 0
    (out / "torchrun.sh").write_text("#!/bin/bash\necho my own edit\n")
    assert launch(recipe, out) == 2
    refused(capsys, "torchrun.sh changed since forge launch wrote it")
    assert "my own edit" in (out / "torchrun.sh").read_text()


def test_a_symlinked_file_in_a_forge_folder_is_not_followed(recipe, tmp_path, capsys):
    out = tmp_path / "job"
    assert launch(recipe, out) == 0
    target = tmp_path / "elsewhere.json"
    target.write_text("precious\n")
    (out / "launch.json").unlink()
    (out / "launch.json").symlink_to(target)
    assert launch(recipe, out) == 2
    refused(capsys, "launch.json")
    assert target.read_text() == "precious\n" and (out / "launch.json").is_symlink()


def test_a_symlinked_folder_is_refused(recipe, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert launch(recipe, tmp_path / "link") == 2
    refused(capsys, "a symbolic link")
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("given, says", [("", "an empty name"), (".", "the current directory"),
                                         ("..", "the current directory")])
def test_the_current_folder_or_an_empty_name_is_refused(recipe, tmp_path, monkeypatch, capsys, given, says):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["launch", str(recipe), "--engine", "torchrun", "--target", "local", "--out", given]) == 2
    refused(capsys, says)
    assert list(work.iterdir()) == []


def test_a_file_is_refused(recipe, tmp_path, capsys):
    out = tmp_path / "job"
    out.write_text("a file\n")
    assert launch(recipe, out) == 2
    refused(capsys, "is a file")
    assert out.read_text() == "a file\n"


def test_a_failure_while_writing_leaves_the_earlier_job_whole(recipe, tmp_path, monkeypatch, capsys):
    from forge.launch import out as out_module

    out = tmp_path / "job"
    assert launch(recipe, out, "torchrun", "h100:16") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = out_module._write, []

    def disk_full_on_the_second_file(path, data):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(out_module, "_write", disk_full_on_the_second_file)
    assert launch(recipe, out, "slurm", "p5.48xlarge") == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["job"]
