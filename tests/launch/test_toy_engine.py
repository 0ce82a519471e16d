"""A launch engine added from inside a test, touching no other file: a render function, a submit
function and a row of forge.launch.engines.ENGINES. `forge launch` then offers it, lists it in its
help with its own flags, writes its files in the plan's layout and starts it with --submit, like the
built-in engines."""
from __future__ import annotations

import json
import shlex

import pytest

from forge.cli import main
from forge.launch.engines import ENGINES, Engine
from forge_testing import base_recipe, write_recipe

STARTED: list[str] = []


def toy_flags(group):
    group.add_argument("--toy-queue", default="default", help="the toy scheduler's queue")


def toy_render(args, launch, recipe, header):
    """One line per node: the queue, the node's processes and the command every process runs."""
    command = shlex.join(["python", *launch.run_args()])
    lines = [f"# {h}" for h in header] + [f"queue={args.toy_queue} node={n} procs={launch.procs_per_node} {command}"
                                          for n in range(launch.nodes)]
    return {"toy.job": "\n".join(lines) + "\n"}, {"queue": args.toy_queue, "nodes": launch.nodes}


def toy_submit(args, launch, recipe, job, out):
    STARTED.append(f"{job['queue']}:{(out / 'toy.job').read_text().count('node=')}")
    return f"toy job {len(STARTED)} on queue {job['queue']}"


@pytest.fixture
def toy(monkeypatch):
    STARTED.clear()
    monkeypatch.setitem(ENGINES, "toy", Engine("toy", "a toy scheduler's job file", f"{__name__}:toy_render",
                                               toy_flags, cluster=False, submit=f"{__name__}:toy_submit"))


def test_a_toy_engine_writes_its_job_in_the_plans_layout_and_starts_it(toy, tmp_path, capsys):
    recipe = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", "toy", "--target", "local", "--out", str(out),
                 "--toy-queue", "gpu-a", "--submit"]) == 0
    lines = (out / "toy.job").read_text().splitlines()
    launched = json.loads((out / "launch.json").read_text())["launched"]
    nodes = [ln for ln in lines if ln.startswith("queue=")]
    assert len(nodes) == launched["nodes"] and all(f"procs={launched['processes_per_node']}" in n for n in nodes)
    assert all(ln.startswith("queue=gpu-a ") and f"-m forge.cli run {recipe}" in ln for ln in nodes)
    assert lines[0].startswith(f"# forge launch {recipe}")  # the header every engine gets
    assert STARTED == [f"gpu-a:{launched['nodes']}"]
    assert "started toy job 1 on queue gpu-a" in capsys.readouterr().out


def test_the_help_lists_the_toy_engine_and_its_flags_and_the_table_refuses_for_it(toy, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    shown = capsys.readouterr().out
    assert "toy: a toy scheduler's job file" in shown and "--toy-queue" in shown
    ENGINES["toy"] = Engine("toy", "a toy scheduler's job file", f"{__name__}:toy_render", toy_flags)  # no submit
    recipe = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    assert main(["launch", str(recipe), "--engine", "toy", "--target", "local", "--out", str(tmp_path / "j"),
                 "--submit"]) == 2
    err = capsys.readouterr().err
    assert "--submit starts sagemaker jobs; a toy job is started with its engine's own command" in err
    assert main(["launch", str(recipe), "--engine", "toy", "--target", "local", "--out", str(tmp_path / "j")]) == 2
    assert "--engine toy runs on a cluster; --target local is this machine (use --engine torchrun)" \
        in capsys.readouterr().err and not (tmp_path / "j").exists()
