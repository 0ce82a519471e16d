"""The architecture rules docs/ARCHITECTURE.md describes, checked on the source: the import map
(who may import whom), no import cycles between modules, no private names across modules, only
forge/track/ imports MLflow, at most 7 parameters a function, and `mypy --strict` on the typed
packages."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forge_testing import REPO

# ------------------------------------------------------------------------------ the import map
# Units are forge's subpackages and top-level modules (`forge` itself is forge/__init__.py: the
# version), and pipelines/. Each unit may import itself and the units listed for it, nothing else.
# The CLI reaches a pipeline by name (importlib), never by an import statement.
LEAVES = {"forge", "forge.errors", "forge.files", "forge.base_check", "forge.usercode", "forge.rundir",
          "forge.lineage", "forge.scrub", "forge.progress", "forge.runlog"}  # small helpers: import only each other
# (forge.scrub, the one scrubber every writer calls, also imports forge.data's secret and PII detectors)
SCHEMA = {"forge.recipe", "forge.kinds", "forge.catalog"}  # the recipe schema and the kinds table
MIDDLE = {"forge.train", "forge.data", "forge.gen", "forge.lm", "forge.eval", "forge.plan", "forge.launch", "forge.track",
          "forge.export", "forge.inputs", "forge.scratch", "forge.quiet", "forge.ui", "forge.advice", "forge.pipeline"}

IMPORT_MAP: dict[str, set[str]] = {
    "forge.cli": MIDDLE | SCHEMA | LEAVES | {"forge.serve"},  # never pipelines: it loads one by name
    "pipelines": {"forge.stages"} | MIDDLE | SCHEMA | LEAVES,
    "forge.stages": MIDDLE | SCHEMA | LEAVES,
    # `forge serve`: the Tinker API over forge.train; forge.export merges a checkpoint it registers
    "forge.serve": {"forge.train", "forge.track", "forge.export"} | SCHEMA | LEAVES,
    # the middle layer: each lists the units of that layer it builds on
    "forge.data": LEAVES,                                  # never the recipe: forge.inputs adapts it
    "forge.gen": {"forge.data"} | LEAVES,                  # generate: sources (the stable split); never the recipe
    "forge.train": {"forge.data"} | LEAVES,                # never the recipe
    "forge.lm": {"forge.train", "forge.data"} | SCHEMA | LEAVES,  # generation, perplexity, rewards
    "forge.track": LEAVES,                                 # the only unit that imports mlflow
    "forge.eval": {"forge.lm", "forge.data", "forge.train", "forge.track", "forge.inputs", "forge.quiet"} | SCHEMA
    | LEAVES,                                              # never stages
    "forge.plan": {"forge.track", "forge.advice"} | SCHEMA | LEAVES,
    "forge.launch": {"forge.plan"} | SCHEMA | LEAVES,    # job files for the user's engine, from a plan
    "forge.advice": SCHEMA | LEAVES,                       # starting-point advice: the catalog and the kinds table
    "forge.pipeline": {"forge.plan", "forge.track"} | SCHEMA | LEAVES,  # `forge run`'s contract with a pipeline (types)
    "forge.export": {"forge.track", "forge.quiet"} | SCHEMA | LEAVES,
    "forge.inputs": {"forge.data", "forge.gen", "forge.scratch", "forge.lm"} | SCHEMA | LEAVES,  # forge.lm: rewrite's model
    "forge.scratch": {"forge.data"} | SCHEMA | LEAVES,
    "forge.quiet": {"forge.track"} | LEAVES,
    "forge.ui": {"forge.track"} | SCHEMA | LEAVES,
    # the schema layer
    # the recipe describes data with forge.data's own config types (FormatSpec, HygieneConfig): data
    # sits below the recipe and never imports it (NO_RECIPE)
    "forge.recipe": {"forge.catalog", "forge.data"} | LEAVES,
    "forge.kinds": {"forge.recipe"} | LEAVES,              # stage modules and planner builders by name only
    "forge.catalog": LEAVES,                               # foundation families: never the recipe or pipelines/
    # leaves
    "forge": set(),
    "forge.errors": set(),
    "forge.files": {"forge.errors"},
    "forge.progress": set(),                               # progress lines, for every layer
    "forge.runlog": set(),                                 # the run's log file, OUTPUT/forge.log
    "forge.base_check": set(),
    "forge.usercode": {"forge.errors"},
    "forge.rundir": {"forge.errors", "forge.scrub", "forge.runlog"},  # runlog: the log file's name
    "forge.lineage": {"forge", "forge.errors", "forge.files", "forge.scrub"},
    "forge.scrub": {"forge.data"},                         # every writer's one scrubber: the detectors
}
NO_RECIPE = ("forge.data", "forge.gen", "forge.train")  # not even the recipe's settings modules

# `mypy --strict` runs on these folders (add forge/train, forge/stages, ... as they are typed)
TYPED = ["forge/track", "forge/train", "forge/stages", "forge/lm", "forge/pipeline.py", "forge/serve"]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted([*(REPO / "forge").rglob("*.py"), *(REPO / "pipelines").rglob("*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = path
    return mods


MODULES = _modules()


def _unit(module: str) -> str:
    parts = module.split(".")
    return "pipelines" if parts[0] == "pipelines" else ".".join(parts[:2])


def _imports(module: str) -> list[tuple[str, str, int]]:
    """(imported forge/pipelines module, name imported from it or "", line) for every import
    statement of `module`, those inside functions too; relative imports resolved."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full, "", node.lineno) if full in MODULES else (base, a.name, node.lineno))
    return out


def _edges() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}


def test_the_map_names_every_unit():
    units = {_unit(m) for m in MODULES}
    assert not units - set(IMPORT_MAP), f"add these to IMPORT_MAP: {sorted(units - set(IMPORT_MAP))}"
    listed = set().union(*IMPORT_MAP.values())
    assert listed <= set(IMPORT_MAP) and "pipelines" not in listed


def test_imports_follow_the_map():
    bad = []
    for m in MODULES:
        for target, _, line in _imports(m):
            if target.split(".")[0] not in ("forge", "pipelines") or target == m:
                continue
            a, b = _unit(m), _unit(target)
            if a != b and b not in IMPORT_MAP.get(a, set()):
                bad.append(f"{MODULES[m].relative_to(REPO)}:{line}: {a} imports {target} ({b} is not in its map)")
            if a in NO_RECIPE and b == "forge.recipe":
                bad.append(f"{MODULES[m].relative_to(REPO)}:{line}: {a} imports the recipe ({target})")
    assert not bad, "\n".join(bad)


def test_no_private_names_cross_modules():
    bad = [f"{MODULES[m].relative_to(REPO)}:{line}: imports {target}.{name}"
           for m in MODULES for target, name, line in _imports(m)
           if name.startswith("_") and not name.startswith("__") and target in MODULES and target != m]
    assert not bad, "\n".join(bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(_edges())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_only_track_imports_mlflow():
    users = [m for m in MODULES for t, _, _ in _imports(m) if t == "mlflow" or t.startswith("mlflow.")]
    assert users and all(_unit(u) == "forge.track" for u in users), sorted(set(users))
    assert "forge.track.names" not in users and "forge.track.protocol" not in users  # plain text, the protocol


def test_importing_the_tracker_protocol_does_not_import_mlflow():
    code = "import sys, forge.track.protocol, forge.track.notes; assert 'mlflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# ------------------------------------------------------------------------------ function size
MAX_PARAMS = 7


def test_no_function_takes_more_than_seven_parameters():
    bad = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None]
                n = len([x for x in names if x not in ("self", "cls")])
                if n > MAX_PARAMS:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name} takes {n}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------ types
def _mypy(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                       capture_output=True).returncode != 0:
        pytest.skip("mypy is not installed (pip install -e '.[test]' brings it)")
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=REPO, capture_output=True, text=True)


def test_typed_packages_pass_mypy_strict():
    got = _mypy("--strict", *TYPED)
    assert got.returncode == 0, got.stdout + got.stderr


def test_the_trackers_satisfy_the_tracker_protocol():
    """tests/typecheck/trackers.py assigns the MLflow tracker and the tests' Recorder to Tracker;
    other modules are taken as Any (`skip`), so this stays a check of the protocol, in a second."""
    got = _mypy("--cache-dir=/dev/null", "--follow-imports=skip", "tests/typecheck/trackers.py", "tests/forge_testing.py",
                "forge/track")
    assert got.returncode == 0, got.stdout + got.stderr


def test_the_recipe_settings_satisfy_the_training_protocols():
    """tests/typecheck/recipe_settings.py assigns the recipe's settings classes to forge.train.settings'
    Protocols (forge.train never imports the recipe); the recipe's types are read, not skipped."""
    got = _mypy("--strict", "tests/typecheck/recipe_settings.py")
    assert got.returncode == 0, got.stdout + got.stderr


# ------------------------------------------------------------------------------ the kinds table
def test_the_kinds_table_is_the_recipe_schema():
    from forge.kinds import KINDS

    for name, kind in KINDS.items():
        assert kind.settings.model_fields["kind"].annotation.__args__ == (name,)
        assert callable(kind.runner())
