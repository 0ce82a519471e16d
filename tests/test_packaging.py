"""The README's two commands, CI running the README's test command, and the Dockerfile."""
from __future__ import annotations

import re
import shlex

from forge_testing import REPO


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_gives_exactly_two_commands_install_and_quickstart_then_tests():
    quickstart, tests = _readme_commands()
    assert "pip install torch==2.13.0" in quickstart and "forge run recipes/quickstart.yaml" in quickstart
    assert "pip install -e '.[test,eval]'" in tests and tests.rstrip().endswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command():
    """CI takes the README's steps in order, but runs its last, `python -m pytest -q`, as lint and two
    tiers: `-m "not slow"` (stopping at the first failure) then `-m slow`, each on two processes. Each
    tier is the README's command plus only -x, one marker expression and pytest-xdist's flags, and the
    two expressions are complements, so the tiers together select exactly the tests the README's
    command runs."""
    ci = (REPO / ".ci" / "run").read_text()
    _, tests = _readme_commands()
    steps = [s.strip() for s in tests.split("&&")]
    *setup, readme_pytest = steps
    lines = [line.strip().replace("pip install -q ", "pip install ") for line in ci.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    assert [line for line in lines if line in setup] == setup  # every step before the tests, in order
    runs = [i for i, line in enumerate(lines) if line.startswith(readme_pytest)]
    assert len(runs) == 2 and runs == [len(lines) - 2, len(lines) - 1], "the two tiers end CI"
    assert lines.index(setup[-1]) < lines.index("ruff check .") < runs[0], "lint after the install, before the tests"
    fast, slow = (shlex.split(lines[i].removeprefix(readme_pytest)) for i in runs)
    # nothing else that would deselect (no -k, paths, --ignore); pytest-xdist's flags only spread the
    # selected tests over two processes (a file's tests in one, for the slow tier's shared fixtures)
    assert fast == ["-x", "-m", "not slow", "-n", "2"], fast
    assert slow == ["-m", "slow", "-n", "2", "--dist", "loadfile"], slow
    assert fast[2] == f"not {slow[1]}"  # complements: every test is in exactly one tier
    assert "slow:" in " ".join(_pytest_markers())  # the marker the tiers split on is declared


def _pytest_markers() -> list[str]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]


def test_dockerfile_installs_forge_with_forge_as_entrypoint():
    instructions = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            instructions.append((word.upper(), rest))
    words = [w for w, _ in instructions]
    assert words[0] == "FROM" and "ENTRYPOINT" in words
    entry = dict(instructions)["ENTRYPOINT"]
    assert entry == '["forge"]'
    runs = " ".join(r for w, r in instructions if w == "RUN")
    assert "torch==2.13.0" in runs and "pip install ." in runs
    copied = {shlex.split(r)[0] for w, r in instructions if w == "COPY"}
    assert {"forge", "pipelines"} <= copied


def test_benchmarks_import():
    """Every benchmark imports what exists (tests/test_bench_quick.py runs each one's --quick mode)."""
    import importlib.util
    import sys

    for path in sorted((REPO / "bench").glob("bench_*.py")):
        spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(REPO))
        try:
            spec.loader.exec_module(module)  # the work itself is guarded by __name__ == "__main__"
        finally:
            sys.path.remove(str(REPO))


def test_dockerfile_runs_as_a_non_root_user():
    instructions = [line.strip().partition(" ")[::2] for line in (REPO / "Dockerfile").read_text().splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    words = [w.upper() for w, _ in instructions]
    assert "USER" in words, "the image must not run forge as root"
    last_user = max(i for i, w in enumerate(words) if w == "USER")
    user = instructions[last_user][1].split(":")[0].strip()
    assert user not in ("root", "0", ""), user
    assert last_user < words.index("ENTRYPOINT")
    # every install runs before the switch, so the runtime user cannot modify installed code
    assert all(i < last_user for i, w in enumerate(words) if w == "RUN")



def test_package_data_covers_every_data_file_forge_reads():
    """A non-editable install carries forge's YAML/JSON/TOML files: pyproject's package-data
    patterns cover every data file under forge/ (the launch schema once fell outside them)."""
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["forge"]
    suffixes = {p.rsplit("*", 1)[-1] for p in patterns}
    data = {p.suffix for p in (REPO / "forge").rglob("*.*") if p.suffix not in (".py", ".pyc") and
            "__pycache__" not in p.parts}
    assert data <= suffixes, f"data files under forge/ that an install would leave out: {data - suffixes}"
