"""Runtime faults end in one clear message, with the run folder left resumable: a full disk (or
a folder made read-only) during a checkpoint, a damaged MLflow store, an output that is a file."""
from __future__ import annotations

import errno
import json

import mlflow
import pytest
import torch

from forge import cli
from forge.train.checkpoint import latest_checkpoint
from forge_testing import REPO, base_recipe, pretrain_stage, refusal, write_recipe


def _recipe(tmp_path, **stage):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(**stage)], tracking={"register_model": False})
    return write_recipe(tmp_path / "r.yaml", recipe)


@pytest.mark.slow
def test_disk_full_during_a_checkpoint(tmp_path, monkeypatch, capsys):
    path = _recipe(tmp_path, max_steps=6, checkpoint={"every": 2})
    real, calls = torch.save, {"n": 0}

    def full(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the step-4 checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch, "save", full)
        assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot write checkpoint" in err and "No space left on device" in err and "Traceback" not in err
    stage = tmp_path / "out" / "stages" / "cpt"
    assert latest_checkpoint(stage / "checkpoints") == stage / "checkpoints" / "step-0000002"  # intact
    assert not (stage / "checkpoints" / "step-0000004.partial").exists()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["tiny"], output_format="list")
    assert {r.info.status for r in runs} == {"FAILED"}
    assert cli.main(["run", str(path), "--resume"]) == 0
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    assert lineage["stages"][0]["steps"] == 6


@pytest.mark.slow
def test_damaged_store_refused_before_any_work_and_folder_left_startable(tmp_path, capsys):
    path = _recipe(tmp_path, max_steps=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mlflow.db").write_bytes(b"garbage" * 500)
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "mlflow.db" in err and "move it aside" in err
    assert not (tmp_path / "out" / "stages").exists()
    (tmp_path / "out" / "mlflow.db").unlink()
    assert cli.main(["run", str(path)]) == 0  # nothing started: no --resume needed


def test_file_system_refusal_is_one_line(monkeypatch, capsys):
    def readonly(args):
        raise OSError(errno.EROFS, "Read-only file system", "/runs/x/novella.partial")

    monkeypatch.setattr(cli, "_validate", readonly)
    assert cli.main(["validate", "r.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("forge: error: /runs/x/novella.partial: Read-only file system") and "Traceback" not in err


# ------------------------------------------------------------------------- issue 18: item 8
import os  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("where", ["prepare_inputs", "finish_novella"])  # data preparation; evaluation + registry
def test_sigterm_outside_training_prints_a_quoted_resume_hint_that_works(tmp_path, monkeypatch, capsys, where):
    import pipelines.novella as novella

    odd = tmp_path / "x $(touch pwned) 'q"
    odd.mkdir()
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)])
    path = write_recipe(odd / "r.yaml", recipe)
    real = getattr(novella, where)

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        with monkeypatch.context() as m:
            m.setattr(novella, where, terminated)
            assert cli.main(["run", str(path), "stages[0].seed=3"]) == 143
        err = capsys.readouterr().err
        hint = err.split("continue with: ", 1)[1].splitlines()[0]
        shown = subprocess.run(["bash", "-c", "printf '%s\\n' " + hint.removeprefix("forge ")], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60).stdout.splitlines()
        assert shown == ["run", str(path), "stages[0].seed=3", "--resume"]
        assert not (tmp_path / "pwned").exists()
        assert cli.main(shlex.split(hint)[1:]) == 0  # the printed command continues the run
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "finished"


# ------------------------------------------------------------------------ issue 18: item 10
@pytest.mark.slow
@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_ui_port_out_of_range_is_one_line(tmp_path, capsys, port):
    from forge.track import MlflowTracker

    MlflowTracker(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}", "tiny")
    capsys.readouterr()
    assert cli.main(["ui", "--output", str(tmp_path / "out"), "--port", port]) == 2
    err = refusal(capsys.readouterr().err)  # after the command's first line
    assert err.startswith(f"forge: error: --port {port}: expected a port number from 1 to 65535")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("form", ["{}", "sqlite:///{}", "file://{}"])
def test_tracking_uri_that_is_a_text_file_is_one_line(tmp_path, capsys, form):
    text = tmp_path / "notes.txt"
    text.write_text("just some notes\n" * 50)
    path = _recipe(tmp_path, max_steps=2)
    assert cli.main(["run", str(path), f"tracking.uri={form.format(text)}"]) == 2
    err = refusal(capsys.readouterr().err)  # after the run's progress lines
    assert str(text) in err and ("is a file, not an MLflow store" in err or "not an MLflow database" in err)
    assert "unexpected" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert text.read_text() == "just some notes\n" * 50


@pytest.mark.parametrize("form", ["{}", "sqlite:///{}"])
def test_ui_on_a_text_file_store_is_one_line(tmp_path, capsys, form):
    text = tmp_path / "notes.txt"
    text.write_text("just some notes\n" * 50)
    assert cli.main(["ui", "--tracking-uri", form.format(text), "--port", "5999"]) == 2
    err = refusal(capsys.readouterr().err)  # after the command's first line
    assert str(text) in err and ("is a file, not an MLflow store" in err or "not an SQLite database" in err)
    assert "unexpected" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------ issue 34: minor items
import sys  # noqa: E402

WORKER = """
import sys
from forge import cli
args = cli.build_parser(["run", "r"]).parse_args(["run", "my recipe.yaml", "stages[0].seed=3", "--restart"])
print("HINT", cli.resume_command(args), flush=True)
"""


@pytest.mark.slow
def test_the_resume_hint_under_torchrun_repeats_the_torchrun_line(tmp_path):
    worker = tmp_path / "w.py"
    worker.write_text(WORKER)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launcher, str(worker)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    hint = next((line.split("HINT ", 1)[1] for line in done.stdout.splitlines() if "HINT " in line), None)
    assert hint is not None, done.stdout + done.stderr
    assert shlex.split(hint) == [*launcher, str(worker), "run", "my recipe.yaml", "stages[0].seed=3", "--resume"]


def test_the_resume_hint_from_torchrun_environment_alone(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")  # this process's parent is no torchrun: the environment says how
    args = cli.build_parser(["run", "r"]).parse_args(["run", "r.yaml"])
    assert cli.resume_command(args) == "torchrun --nnodes 2 --nproc_per_node 2 -m forge.cli run r.yaml --resume"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert cli.resume_command(args) == "forge run r.yaml --resume"


GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:37008. This is typically caused by a remote worker crashing. Check the logs of the remote "
        "worker before reporting an error.")  # what rank 0 got from all_reduce after rank 1 died (torch 2.13, gloo)


@pytest.mark.slow
def test_a_peer_rank_dying_mid_collective_is_one_line_and_the_resume_hint(tmp_path, monkeypatch, capsys):
    from forge.train import accel

    class TwoRanks:
        is_main_process, num_processes, process_index = True, 2, 0

        def wait_for_everyone(self):
            pass

    def collective_fails(*args, **kwargs):
        raise RuntimeError(GLOO)

    path = _recipe(tmp_path, max_steps=2)
    monkeypatch.setattr(accel, "process_state", lambda: TwoRanks())
    monkeypatch.setattr(cli, "_run_pipeline", collective_fails)
    assert cli.main(["run", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == ("forge: another rank of this 2-process run stopped or died (Connection closed by peer "
                       "[127.0.0.1]:37008); its output says why")
    assert err[-1] == f"  continue with: forge run {path} --resume"
    assert not any("unexpected" in line for line in err)
