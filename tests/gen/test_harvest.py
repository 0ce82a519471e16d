"""The harvest (forge/gen/harvest.py) reads docstring prose by parsing files, never importing them,
deterministically; the curated sets (forge/gen/curated.py) put held-out records exactly where
forge's stable split holds out, and hold the same units out in every set."""
from __future__ import annotations

import json
import re
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from forge.data.mixing import aligned, in_holdout
from forge.gen import curated, harvest
from forge.gen.instructions import generate, pools

BOOM = '''"""A module that must never run: it leaves a marker file when imported.

Importing it writes a marker next to this file and exits the interpreter straight away.
"""
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("ran")
raise SystemExit("imported")


class Widget:
    """A widget holds a colour and a size for the demonstration below.

    >>> Widget().colour
    'red'

    :param colour: the colour
    """


def _private():
    """A private helper that the harvest leaves out entirely from what it reads."""
'''


@pytest.fixture()
def root(tmp_path):
    """A small library: a module with side effects, a package, and copies of the standard library's
    `antigravity` (opens a browser) and `this` (prints the Zen of Python) when they are there."""
    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "boom.py").write_text(BOOM)
    (lib / "pkg" / "__init__.py").write_text('"""Tools for counting the apples and pears in a basket of fruit."""\n')
    (lib / "tests").mkdir()
    (lib / "tests" / "t.py").write_text('"""Tests are skipped by the harvest, so this sentence is never read."""\n')
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("antigravity.py", "this.py"):
        if (stdlib / name).is_file():
            shutil.copyfile(stdlib / name, lib / name)
    harvest._harvest.cache_clear()
    yield lib
    harvest._harvest.cache_clear()


def test_harvest_parses_and_never_imports(root, capsys):
    before = set(sys.modules)
    docs = harvest.harvest([("site", root)], workers=1)
    assert not (root / "IMPORTED").exists()
    assert not {"boom", "antigravity", "this", "webbrowser"} & (set(sys.modules) - before)
    assert capsys.readouterr().out == ""  # `this` prints the Zen of Python when imported
    texts = {d.key: d.text for d in docs}
    assert texts["boom:"].startswith("A module that must never run")
    assert texts["boom:Widget"] == "A widget holds a colour and a size for the demonstration below."  # no doctest/fields
    assert texts["pkg:"] == "Tools for counting the apples and pears in a basket of fruit."
    assert not any("_private" in k or k.startswith("tests") for k in texts)


def test_prose_filter_drops_code_and_reduces_markup():
    text, share = harvest.prose_of(
        "Return the :func:`len` of ``items`` as an *integer* value for the caller.\n\n"
        ">>> f([1, 2])\n2\n\nParameters\n----------\nitems : list\n    The items.\n\n"
        "    indented_code(x) = 1\n\nShort line.")
    assert text == "Return the len of items as an integer value for the caller."
    assert 0 < share < 1


@pytest.mark.slow
def test_harvest_is_deterministic(root):
    first = harvest.harvest([("site", root)], workers=1)
    harvest._harvest.cache_clear()
    assert harvest.harvest([("site", root)], workers=1) == first
    stdlib = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    harvest._harvest.cache_clear()
    one = harvest.harvest(stdlib, cap_files=250, workers=1)
    harvest._harvest.cache_clear()
    assert harvest.harvest(stdlib, cap_files=250, workers=2) == one  # parse workers do not change it
    assert len(one) > 300


@pytest.mark.slow
def test_curated_files_are_byte_identical_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(harvest, "MAX_FILES_PER_ROOT", 40)
    harvest._harvest.cache_clear()
    for name, n in (("general", 400), ("instructions", 300), ("preferences", 100)):
        a = curated.write_curated(name, n, 0, tmp_path / "a" / f"{name}.jsonl")
        harvest._harvest.cache_clear()
        b = curated.write_curated(name, n, 0, tmp_path / "b" / f"{name}.jsonl")
        assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 1000


def test_held_out_records_sit_where_the_split_holds_out():
    flagged = [({"text": f"doc {i}"}, harvest.held_out(f"u{i}", 0.1)) for i in range(2000)]
    rows = aligned(flagged, "general", 0.1)
    held = {r["text"] for r, h in flagged if h}
    for n, row in enumerate(rows, start=1):
        assert (row["text"] in held) == in_holdout("general", n, 0.1), n
    assert len({r["text"] for r in rows} - held) == 2000 - len(held)  # every training record, once


def test_instruction_tasks_answer_from_their_prompt():
    docs = [harvest.Doc("mod.a", "", "module", "This module provides tools for reading the weather forecast.", 1.0),
            harvest.Doc("mod.a", "get", "function", "Return the number of sunny days in the month.", 1.0),
            harvest.Doc("mod.b", "", "module", "Helpers that parse the calendar of every public holiday in town. "
                        "The calendar lists each holiday with its date and its name.", 1.0)]
    rows = generate("preferences", pools(docs * 3, 0.05), 60, 0, 0.05)
    tasks = {r["task"] for r, _ in rows}
    assert {"copy", "first_word", "last_word", "larger", "smaller", "facts_qa", "returns_qa"} <= tasks
    for r, _ in rows:
        assert r["chosen"] != r["rejected"]
        if r["task"] in ("copy", "facts_qa", "returns_qa", "first_word", "last_word"):
            assert r["chosen"] in r["prompt"], r
        if r["task"] == "larger":
            a, b = (int(x) for x in re.findall(r"\d+", r["prompt"]))
            assert r["chosen"] == str(max(a, b))
    json.dumps([r for r, _ in rows])  # plain JSON records


CORPUS = """import hashlib, sys
from pathlib import Path
from forge.gen import curated, generate
out = Path(sys.argv[1])
for name, n in (("general", 300), ("long", 40), ("instructions", 200)):
    path = curated.write_curated(name, n, 0, out / f"{name}.jsonl", stories=generate.stories)
    print(name, hashlib.sha256(path.read_bytes()).hexdigest())
"""


@pytest.mark.slow
def test_the_corpus_does_not_depend_on_what_else_is_installed(tmp_path):
    """The curated sets built in this environment and in a second one with one more package
    installed (a venv seeing this one's packages, plus its own with docstrings) are the same bytes."""
    import os
    import subprocess

    repo = Path(curated.__file__).parents[2]
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    site = Path(subprocess.run([str(other / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    (site / "forge_env.pth").write_text(f"{repo}\n{sysconfig.get_paths()['purelib']}\n")
    (site / "extra_pkg").mkdir()
    (site / "extra_pkg" / "__init__.py").write_text(
        '"""The extra package explains how every harbour in the county keeps its lighthouse lit at night."""\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    runs = [subprocess.run([py, "-c", CORPUS, str(tmp_path / label)], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
            for label, py in (("here", sys.executable), ("there", str(other / "bin" / "python")))]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.count("\n") == 3
    assert "lighthouse" not in (tmp_path / "there" / "general.jsonl").read_text()
