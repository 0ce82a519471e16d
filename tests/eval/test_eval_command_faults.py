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


@pytest.mark.slow
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


# ------------------------------------------------------------------------- issue 34: item 5
import json  # noqa: E402
import os  # noqa: E402

from forge_testing import refusal  # noqa: E402


@pytest.fixture
def suite(tmp_path):
    """A suite file: held-out perplexity on a little generated text (seconds on the tiny model)."""
    spec = {"data": {"general": {"generate": {"kind": "stories", "documents": 40}}},
            "eval": {"perplexity": ["general"], "domain": [], "general": [], "seq_len": 32, "max_blocks": 2}}
    return write_recipe(tmp_path / "suite.yaml", spec)


def _eval(model, suite, *flags) -> list[str]:
    return ["eval", "--models", str(model), "--suite", str(suite), *flags]


def _novella_and_run(tmp_path):
    """A Novella and a run folder as forge marks them (lineage.json; run.json), with a file each."""
    novella, run = tmp_path / "runs" / "x" / "novella", tmp_path / "runs" / "x"
    novella.mkdir(parents=True)
    (novella / "lineage.json").write_text("{}")
    (novella / "config.json").write_text('{"model_type": "llama"}')
    (run / "run.json").write_text('{"status": "finished"}')
    return novella, run


@pytest.mark.parametrize("flag", ["--json", "--markdown", "--chart"])
def test_eval_reports_never_go_into_a_novella_or_a_run_folder(tiny_checkpoint, suite, tmp_path, capsys, flag):
    novella, run = _novella_and_run(tmp_path)
    for target in (novella / "config.json", run / "report.out", novella / "new.out"):
        for extra in ([], ["--overwrite"]):
            capsys.readouterr()
            assert cli.main(_eval(tiny_checkpoint, suite, flag, str(target), *extra)) == 2
            err = refusal(capsys.readouterr().err)
            assert err.startswith(f"forge: error: {flag} {target}: inside ")
            assert ("the Novella" if "novella" in str(target) else "the forge run folder") in err
    assert (novella / "config.json").read_text() == '{"model_type": "llama"}'
    assert _listing(run) == ["novella", "novella/config.json", "novella/lineage.json", "run.json"]


def test_eval_report_into_a_missing_folder_is_refused_and_not_created(tiny_checkpoint, suite, tmp_path, capsys):
    target = tmp_path / "reports" / "today" / "e.json"
    assert cli.main(_eval(tiny_checkpoint, suite, "--json", str(target))) == 2
    err = refusal(capsys.readouterr().err)
    assert err == f"forge: error: --json {target}: the folder {tmp_path / 'reports'} does not exist; create it first\n"
    assert not (tmp_path / "reports").exists()


def test_eval_reports_replace_only_forge_reports_unless_overwrite(tiny_checkpoint, suite, tmp_path, capsys):
    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    assert cli.main(_eval(tiny_checkpoint, suite, "--markdown", str(mine))) == 2
    err = refusal(capsys.readouterr().err)
    assert err.startswith(f"forge: error: --markdown {mine}: a file forge eval did not write") and "--overwrite" in err
    assert mine.read_text() == "my notes\n"

    reports = tmp_path / "reports"
    reports.mkdir()
    flags = ["--json", str(reports / "e.json"), "--markdown", str(reports / "e.md"), "--chart", str(reports / "e.png")]
    for _ in range(2):  # the second run replaces the first one's reports: forge wrote them
        assert cli.main(_eval(tiny_checkpoint, suite, *flags)) == 0, capsys.readouterr().err
    assert _listing(reports) == ["e.json", "e.md", "e.png"]  # no temporary file left beside them
    assert json.loads((reports / "e.json").read_text())["schema"] == "forge.eval/1"
    assert "| ppl.general |" in (reports / "e.md").read_text()
    assert (reports / "e.png").read_bytes()[:4] == b"\x89PNG"

    assert cli.main(_eval(tiny_checkpoint, suite, "--markdown", str(mine), "--overwrite")) == 0
    assert "| ppl.general |" in mine.read_text()


def test_eval_reports_refuse_a_folder_a_link_or_one_file_twice(tiny_checkpoint, suite, tmp_path, capsys):
    (tmp_path / "dir").mkdir()
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    cases = [(["--json", str(tmp_path / "dir")], "a folder, not a file"),
             (["--json", str(tmp_path / "link.json")], "a symbolic link"),
             (["--json", str(tmp_path / "r.out"), "--markdown", str(tmp_path / "r.out")], "the same file")]
    for flags, said in cases:
        assert cli.main(_eval(tiny_checkpoint, suite, *flags, "--overwrite")) == 2
        err = refusal(capsys.readouterr().err)
        assert said in err and "unexpected" not in err, err
    assert (tmp_path / "real.json").read_text() == "{}" and (tmp_path / "link.json").is_symlink()


def test_a_report_that_fails_midway_leaves_the_old_one(tmp_path, monkeypatch):
    from forge.eval import outputs

    old = tmp_path / "e.json"
    old.write_text('{"schema": "forge.eval/1"}')

    def half(fd, data):  # the disk fills halfway through the write
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "_write_all", half)
    with pytest.raises(OSError):
        outputs.write_report(old, b'{"schema": "forge.eval/1", "models": []}')
    assert old.read_text() == '{"schema": "forge.eval/1"}' and os.listdir(tmp_path) == ["e.json"]
