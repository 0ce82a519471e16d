"""Run folder integrity: an interrupted run is resumed or discarded on purpose, a finished one is
only replaced with --overwrite, one run at a time holds the folder, and --resume refuses a
changed recipe (or data, or base) unless told otherwise."""
from __future__ import annotations

import json

import pytest

from forge import cli
from forge.errors import ForgeError
from forge.rundir import RunFolder, recipe_fingerprint
from forge_testing import base_recipe, crash_after, folder_held_by_another_process, pretrain_stage, write_recipe

FP = {"name": "tiny", "stages[0].optim.lr": 0.003, "stages[0].max_steps": 4}


def _open(out, fp=FP, **flags):
    return RunFolder.open(out, fp, **flags)


def test_fresh_then_interrupted_then_finished(tmp_path):
    out = tmp_path / "out"
    with _open(out) as folder:
        first = folder.run_id
        (out / "stages" / "cpt" / "checkpoints" / "step-0000002").mkdir(parents=True)
    with pytest.raises(ForgeError, match=r"interrupted run.*--resume.*--restart"):
        _open(out)
    with _open(out, resume=True) as folder:
        assert folder.run_id == first  # the same run continues: its checkpoints stay its own
        folder.finish()
    with pytest.raises(ForgeError, match=r"finished run.*--overwrite"):
        _open(out)
    with _open(out, overwrite=True) as folder:
        assert folder.run_id != first
        assert not (out / "stages").exists()  # the old run's checkpoints are gone


def test_restart_discards_an_interrupted_run(tmp_path):
    out = tmp_path / "out"
    with _open(out):
        (out / "stages" / "cpt").mkdir(parents=True)
    with _open(out, restart=True):
        assert not (out / "stages").exists()


def test_resume_refuses_a_changed_recipe_naming_the_fields(tmp_path):
    out = tmp_path / "out"
    with _open(out):
        pass
    changed = {**FP, "stages[0].optim.lr": 0.001, "stages[0].text_field": "body"}
    with pytest.raises(ForgeError, match=r"(?s)changed.*stages\[0\]\.optim\.lr: 0\.003 -> 0\.001.*"
                                         r"stages\[0\]\.text_field.*--allow-changed"):
        _open(out, changed, resume=True)
    with _open(out, changed, resume=True, allow_changed=True) as folder:
        folder.check_inputs({"data.general": "aaa", "base": "b1"})
    with _open(out, changed, resume=True) as folder:  # the accepted change is the new reference
        with pytest.raises(ForgeError, match=r"data\.general"):
            folder.check_inputs({"data.general": "bbb", "base": "b1"})


def test_second_run_on_a_folder_says_who_holds_it(tmp_path):
    out = tmp_path / "out"
    with folder_held_by_another_process(out, FP) as proc:
        with pytest.raises(ForgeError, match=rf"in use by another forge run \(pid {proc.pid} on "):
            _open(out, resume=True)
    with _open(out, resume=True):  # released when the holder ends
        pass


def test_output_that_is_a_file_or_unwritable_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ForgeError, match=r"output: .*file.* is a file, not a folder"):
        _open(tmp_path / "file")
    with pytest.raises(ForgeError, match=r"output: cannot write .*forgetest"):
        _open("/proc/forgetest/out")


def test_recipe_fingerprint_names_dotted_fields(tmp_path):
    from forge.recipe import Recipe

    recipe = Recipe(**base_recipe(tmp_path))
    fp = recipe_fingerprint(recipe)
    assert fp["stages[0].optim.lr"] == 0.003 and "output" not in fp


@pytest.mark.slow
def test_cli_refuses_to_start_over_an_interrupted_run_and_a_changed_resume(tmp_path, monkeypatch, capsys):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=3)], tracking={"register_model": False})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    with monkeypatch.context() as m:
        crash_after(m, 1)
        assert cli.main(["run", str(path)]) == 1
    capsys.readouterr()
    assert cli.main(["run", str(path)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert cli.main(["run", str(path), "stages[0].optim.lr=1e-3", "--resume"]) == 2
    assert "stages[0].optim.lr: 0.003 -> 0.001" in capsys.readouterr().err
    assert cli.main(["run", str(path), "--resume"]) == 0
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "finished"
    capsys.readouterr()
    assert cli.main(["run", str(path)]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_resume_refuses_changed_data(tmp_path, monkeypatch, capsys):
    extra = tmp_path / "notes.txt"
    extra.write_text("\n".join(f"note {i}: the valve opens at dawn." for i in range(50)))
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=3)], tracking={"register_model": False})
    recipe["data"]["notes"] = {"path": str(extra)}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    with monkeypatch.context() as m:
        crash_after(m, 1)
        assert cli.main(["run", str(path)]) == 1
    extra.write_text(extra.read_text() + "\nnote 50: changed after the run started.")
    capsys.readouterr()
    assert cli.main(["run", str(path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "inputs changed" in err and "data.notes" in err and "data.general" not in err
    assert cli.main(["run", str(path), "--resume", "--allow-changed"]) == 0


# ---------------------------------------------------------------- issue 18: items 2 and 13
def test_restart_and_overwrite_refuse_a_folder_forge_did_not_write(tmp_path):
    out = tmp_path / "mine"
    (out / "stages").mkdir(parents=True)
    (out / "stages" / "thesis.tex").write_text("years of work")
    (out / "novella").mkdir()
    for flags in ({"restart": True}, {"overwrite": True}, {}, {"resume": True}):
        with pytest.raises(ForgeError, match=r"not a forge run folder.*novella/.*stages/"):
            _open(out, **flags)
    assert (out / "stages" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in out.iterdir()) == ["novella", "stages"]  # not even a lock file left in it
    (out / "run.json").write_text(json.dumps({"status": "finished", "tool": "someone else's"}))
    with pytest.raises(ForgeError, match=r"run\.json.*not written by forge"):
        _open(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["novella", "run.json", "stages"]


def test_restart_applies_to_interrupted_runs_only(tmp_path):
    out = tmp_path / "out"
    with _open(out) as folder:
        (out / "stages" / "cpt").mkdir(parents=True)
        folder.finish()
    with pytest.raises(ForgeError, match=r"finished run.*--restart discards an interrupted run.*--overwrite"):
        _open(out, restart=True)
    assert (out / "stages" / "cpt").is_dir()


@pytest.mark.slow
def test_resume_of_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)])
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["run", str(path)]) == 0
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    before = (tmp_path / "out" / "run.json").read_bytes()
    versions = len(mlflow.MlflowClient().search_model_versions("name='tiny'"))
    runs = len(mlflow.search_runs(experiment_names=["tiny"], output_format="list"))
    capsys.readouterr()
    assert cli.main(["run", str(path), "--resume"]) == 0
    captured = capsys.readouterr()
    assert "finished" in captured.err and "--overwrite" in captured.err and captured.out == ""
    assert (tmp_path / "out" / "run.json").read_bytes() == before
    assert len(mlflow.MlflowClient().search_model_versions("name='tiny'")) == versions == 1
    assert len(mlflow.search_runs(experiment_names=["tiny"], output_format="list")) == runs


def test_second_run_is_refused_before_the_plan_is_printed(tmp_path, capsys):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)], tracking={"register_model": False})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    with folder_held_by_another_process(tmp_path / "out", FP) as proc:
        assert cli.main(["run", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"pid {proc.pid}" in captured.err


@pytest.mark.slow
def test_a_data_error_before_training_leaves_the_folder_startable(tmp_path, capsys):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"body": "no text field here"}\n' * 20)
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2, mixture={"general": 0.5, "notes": 0.5})],
                         tracking={"register_model": False})
    recipe["data"]["notes"] = {"path": str(bad)}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["run", str(path)]) == 2
    assert "notes" in capsys.readouterr().err
    bad.write_text("".join(json.dumps({"text": f"note {i}: the valve opens at dawn."}) + "\n" for i in range(50)))
    assert cli.main(["run", str(path)]) == 0  # nothing had started: no --resume, no --restart needed


# ---------------------------------------------------------------- issue 36, item 5: RunLayout
def test_run_layout_spells_every_place_in_the_folder(tmp_path):
    from forge.rundir import RunLayout

    out = tmp_path / "out"
    layout = RunLayout(str(out))  # a str is taken as a path
    assert layout.out == out
    assert layout.lock == out / ".forge.lock" and layout.run_record == out / "run.json"
    assert layout.resolved_recipe == out / "recipe.resolved.yaml" and layout.tracking == out / "tracking.json"
    assert layout.mlflow_db == out / "mlflow.db" and layout.log == out / "forge.log"
    assert layout.stage("cpt") == out / "stages" / "cpt"
    assert layout.stage_final("cpt") == out / "stages" / "cpt" / "final"
    assert layout.stage_merged("cpt") == out / "stages" / "cpt" / "merged"
    assert layout.stage_checkpoints("cpt") == out / "stages" / "cpt" / "checkpoints"
    assert layout.novella == out / "novella" and layout.data == out / "data"
    assert layout.scratch_base("abc123") == out / "base-abc123"
    assert layout.eval_cache == out / "eval" / "measured.json"
    assert layout.local_rate == out / "local-rate.json" and layout.calibration == out / "calibration.yaml"
    assert layout.foundation == out / "foundation"
    assert layout.export("bedrock") == tmp_path / "out-bedrock"  # beside the folder, never in it
    assert layout.run_outputs() == (out / "stages", out / "novella", out / "recipe.resolved.yaml")
    with pytest.raises(AttributeError):
        layout.out = tmp_path  # frozen: one folder, one layout
    assert RunLayout(out) == layout and len({RunLayout(out), layout}) == 1


def test_a_discarded_run_takes_only_its_outputs(tmp_path):
    from forge.rundir import RunLayout

    layout = RunLayout(tmp_path / "out")
    with _open(layout.out) as folder:
        assert folder.layout == layout and layout.run_record.is_file() and layout.lock.is_file()
        for path in (layout.stage_final("cpt"), layout.novella, layout.data, layout.scratch_base("k")):
            path.mkdir(parents=True)
        for path in (layout.resolved_recipe, layout.tracking):
            path.write_text("{}")
        folder.finish()
    with _open(layout.out, overwrite=True):
        assert not any(p.exists() for p in layout.run_outputs())
        assert layout.data.is_dir() and layout.scratch_base("k").is_dir() and layout.tracking.is_file()


def test_resumable_reads_the_stage_folders_of_the_layout(tmp_path):
    from forge.rundir import RunLayout

    layout = RunLayout(tmp_path / "out")
    with _open(layout.out) as folder:
        assert not folder.resumable()
        (layout.stage_checkpoints("cpt") / "step-0000002").mkdir(parents=True)
        assert folder.resumable()
    with _open(tmp_path / "other") as folder:
        folder.layout.stage_final("sft").mkdir(parents=True)
        assert folder.resumable()


def test_only_the_layout_spells_the_run_folder_names():
    """No module but forge.rundir (and forge.runlog, for its log) names a file of the run folder or
    joins a folder name of it onto a path: each asks RunLayout (forge.train and a stage's kind,
    given a stage's folder, join forge.rundir's FINAL and CHECKPOINTS). forge/serve keeps a
    workdir of its own, not a run folder."""
    import ast

    from forge_testing import REPO

    names = {".forge.lock", "run.json", "recipe.resolved.yaml", "tracking.json", "mlflow.db", "local-rate.json",
             "calibration.yaml", "forge.log", "eval/measured.json"}
    joined = {"final", "stages", "novella", "merged", "checkpoints", "data", "foundation", "eval"}
    owners = {REPO / "forge" / "rundir.py", REPO / "forge" / "runlog.py"}
    bad = []
    for path in sorted([*(REPO / "forge").rglob("*.py"), *(REPO / "pipelines").rglob("*.py")]):
        if path in owners or (REPO / "forge" / "serve") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and \
                    isinstance(node.right, ast.Constant) and node.right.value in joined:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: / {node.right.value!r}")
    assert not bad, "ask forge.rundir.RunLayout instead:\n" + "\n".join(bad)


@pytest.mark.slow
def test_a_run_writes_where_its_layout_says(tmp_path):
    from forge.rundir import RunLayout

    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=2)], tracking={"register_model": False})
    assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0
    layout = RunLayout(tmp_path / "out")
    for path in (layout.lock, layout.run_record, layout.resolved_recipe, layout.tracking, layout.mlflow_db,
                 layout.log, layout.stage_final("cpt") / "config.json", layout.novella / "config.json", layout.data):
        assert path.exists(), path
    bases = [p.name for p in layout.out.glob("base-*")]
    assert len(bases) == 1 and layout.scratch_base(bases[0].removeprefix("base-")).is_dir()
    known = {p.name for p in (layout.lock, layout.run_record, layout.resolved_recipe, layout.tracking, layout.mlflow_db,
                              layout.log, layout.stages, layout.novella, layout.data, layout.local_rate,
                              layout.eval_cache.parent)} | set(bases)
    assert {p.name for p in layout.out.iterdir()} - known <= {"mlartifacts"}  # MLflow's, beside its store
