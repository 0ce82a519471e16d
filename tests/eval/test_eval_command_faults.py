"""`forge eval` on a run folder (issue 18, items 5 and 13): refused while a `forge run` holds the
folder (naming its pid), refused on a folder that holds no run without writing into it, and its
figures go to their own MLflow run: the run's params never keep a different value silently."""
from __future__ import annotations

import mlflow
import pytest

from forge import cli
from forge.errors import ForgeError
from forge.track import MlflowTracker
from forge_testing import base_recipe, folder_held_by_another_process, pretrain_stage, write_recipe


def _listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_eval_on_a_folder_held_by_a_run_is_refused_with_its_pid(tmp_path, capsys):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)]))
    with folder_held_by_another_process(tmp_path / "out") as proc:
        before = _listing(tmp_path / "out")
        assert cli.main(["eval", str(path)]) == 2
        assert _listing(tmp_path / "out") == before  # no data cache, no base written
    first, err = capsys.readouterr().err.split("\n", 1)  # the command's first line, then the refusal
    assert first.startswith(f"forge eval {path}")
    assert f"pid {proc.pid}" in err and "forge run" in err and len(err.strip().splitlines()) == 1


def test_eval_on_a_folder_without_a_run_writes_nothing_there(tmp_path, capsys):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)]))
    other = tmp_path / "not_a_run"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert cli.main(["eval", str(path), f"output={other}"]) == 2
    assert "no stage output or Novella" in capsys.readouterr().err
    assert _listing(other) == ["notes.txt"]
    assert cli.main(["eval", str(path), f"output={tmp_path / 'absent'}"]) == 2
    assert not (tmp_path / "absent").exists()


def test_eval_logs_into_its_own_run_not_the_parent(tmp_path, capsys):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)],
                                                         tracking={"register_model": False}))
    assert cli.main(["run", str(path)]) == 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    parent = next(r for r in mlflow.search_runs(experiment_names=["tiny"], output_format="list")
                  if "mlflow.parentRunId" not in r.data.tags)
    params = dict(parent.data.params)
    assert cli.main(["eval", str(path), "eval.max_blocks=2"]) == 0
    assert cli.main(["eval", str(path), "eval.max_blocks=3"]) == 0
    runs = mlflow.search_runs(experiment_names=["tiny"], output_format="list")
    evals = [r for r in runs if r.data.tags.get("forge.eval_of") == parent.info.run_id]
    assert len(evals) == 2 and all(r.info.status == "FINISHED" for r in evals)
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in evals)
    assert mlflow.get_run(parent.info.run_id).data.params == params  # the parent is untouched


def test_log_params_refuses_to_keep_a_different_value(tmp_path):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'm.db'}", "x")
    with tracker.run("r") as run_id:
        tracker.log_params({"lr": 0.1, "steps": 4})
        tracker.log_params({"lr": 0.1})  # the same value again: fine
        with pytest.raises(ForgeError, match=r"param lr.*0\.1.*0\.2"):
            tracker.log_params({"lr": 0.2, "new": 1})
    assert mlflow.get_run(run_id).data.params == {"lr": "0.1", "steps": "4"}


def test_log_summary_says_when_a_param_keeps_its_earlier_value(tmp_path, capsys):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'm.db'}", "x")
    with tracker.run("r") as run_id:
        tracker.log_summary("data", {"peak_rss_mb": 100})
    with tracker.run("r", run_id=run_id):  # a resumed run
        tracker.log_summary("data", {"peak_rss_mb": 120})
    err = capsys.readouterr().err
    assert "data.peak_rss_mb" in err and "100" in err and "120" in err
    assert mlflow.get_run(run_id).data.tags["forge.params_kept"].startswith("data.peak_rss_mb: 100 (now 120)")
