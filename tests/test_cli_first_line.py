"""The first line of every `forge` command comes before torch, transformers, MLflow or datasets
load: each command runs in a subprocess whose stdout and stderr are replaced by a hook that, at
the first write, reports the text and which heavy libraries `sys.modules` holds, then exits."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forge_testing import REPO, base_recipe, write_recipe

HEAVY = ("torch", "transformers", "mlflow", "datasets")
HOOK = f"""
import json, os, sys
FD = int(os.environ["FIRST_LINE_FD"])
class First:
    def write(self, text):
        if text.strip():
            heavy = [m for m in {HEAVY!r} if m in sys.modules]
            os.write(FD, json.dumps({{"line": text.strip().splitlines()[0], "heavy": heavy}}).encode())
            os._exit(0)
        return len(text)
    def flush(self): pass
    def isatty(self): return False
sys.stdout = sys.stderr = First()
from forge.cli import main
main(sys.argv[1:])
os.write(FD, json.dumps({{"line": None, "heavy": []}}).encode())
"""


def first_line(args: list[str], cwd) -> dict:
    """What the command wrote first, and the heavy libraries loaded by then."""
    import os

    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO), "FIRST_LINE_FD": str(write)}
    proc = subprocess.run([sys.executable, "-c", HOOK, *args], cwd=cwd, pass_fds=(write,), capture_output=True,
                          text=True, timeout=300, env=env)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    assert report, proc.stderr[-2000:]
    return json.loads(report)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("first")
    return write_recipe(tmp / "r.yaml", base_recipe(tmp))


@pytest.mark.parametrize("command", [
    ["run", "{recipe}"],
    ["validate", "{recipe}"],
    ["plan", "{recipe}"],
    ["eval", "{recipe}"],
    ["export", "{tmp}/novella", "--out", "{tmp}/exported"],
    ["deploy", "{tmp}/exported", "--s3-uri", "s3://bucket/x", "--role-arn", "arn:aws:iam::1:role/r", "--dry-run"],
    ["ui", "--output", "{tmp}"],
    ["catalog", "list"],
    ["launch", "{recipe}", "--engine", "torchrun", "--target", "h100:16", "--out", "{tmp}/job"],
])
def test_the_first_line_comes_before_the_heavy_libraries(command, recipe, tmp_path):
    args = [a.format(recipe=recipe, tmp=tmp_path) for a in command]
    got = first_line(args, tmp_path)
    assert got["line"], f"forge {command[0]} printed nothing"
    assert got["heavy"] == [], f"forge {command[0]}: {got['heavy']} loaded before its first line {got['line']!r}"
    if command[0] in ("run", "eval", "export", "deploy", "ui", "launch"):  # the commands whose work is slow say what it is
        assert got["line"].startswith(f"forge {command[0]}"), got["line"]


def test_run_says_what_it_runs_first(recipe, tmp_path):
    line = first_line(["run", str(recipe)], tmp_path)["line"]
    assert line == f"forge run {recipe}: tiny, 1 stage(s): cpt (pretrain); output {recipe.parent / 'out'}"


@pytest.mark.parametrize("given, want", [({}, ("3000", None)),
                                         ({"GOMP_SPINCOUNT": "50"}, ("50", None)),
                                         ({"OMP_WAIT_POLICY": "PASSIVE"}, (None, "PASSIVE"))])
def test_the_cli_lets_openmp_threads_spin_briefly_unless_the_user_chose(given, want):
    """libgomp reads its wait settings when torch loads, so forge.cli sets them at import: a short
    spin (bench/bench_omp.py), never over the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import json, os, forge.cli; print(json.dumps([os.environ.get(k) for k in ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY')]))"
    done = subprocess.run([sys.executable, "-c", code], env={**env, **given, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert tuple(json.loads(done.stdout)) == want, done.stderr


FIRST_LINE_MAX = 200  # a first line says what is starting in one terminal line, not a report


def test_the_foundation_builds_first_line_is_one_short_line():
    """The forge-tiny build (minutes) opens with where it builds and how long it took when measured;
    tested through the function that words it, never by building."""
    from pathlib import Path

    from pipelines import foundation

    home = Path("/home/someone/projects/acme/.forge/foundations/forge-tiny")
    line = foundation.opening(home)
    assert len(line) <= FIRST_LINE_MAX and "\n" not in line, (len(line), line)
    assert line.startswith(f"foundation: building forge-tiny into {home}") and "measured" in line, line
