"""Hostile recipe files: alias bombs, duplicate keys, bytes that are not UTF-8, deep nesting."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import yaml

from forge.errors import ForgeError
from forge.recipe import load_recipe
from forge_testing import REPO, base_recipe, write_recipe


def _laughs(levels: int = 9) -> str:
    lines = ['lol0: &lol0 "lol"']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*lol{i - 1}"] * 9)
        lines.append(f"lol{i}: &lol{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_quickly_within_bounded_memory(tmp_path):
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text(_laughs() + "name: x\nbase: /nowhere\noutput: out\nstages: *lol9\ndata: {a: *lol9}\n")
    # a child process with 1 GiB of address space and 60 s: an expansion of 9**9 nodes gets neither
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from forge import cli
        sys.exit(cli.main(["validate", {str(recipe)!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert str(recipe) in proc.stderr and "alias" in proc.stderr and "Traceback" not in proc.stderr


def test_modest_aliases_still_work(tmp_path):
    recipe = base_recipe(tmp_path)
    text = yaml.safe_dump(recipe, sort_keys=False)
    text = text.replace("stages:\n", "defaults: &opt {lr: 0.003}\nstages:\n", 1)
    text = text.replace("  optim:\n    lr: 0.003\n", "  optim: *opt\n")
    assert "*opt" in text
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ForgeError, match="defaults: unknown key"):  # an alias works; the extra key is named
        load_recipe(path)


def test_duplicate_keys_are_refused_naming_both_lines(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    text = path.read_text()
    text = text.replace("name: tiny\n", "name: tiny\nname: other\n", 1)
    path.write_text(text)
    with pytest.raises(ForgeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert str(path) in msg and "duplicate key 'name'" in msg and "line 1" in msg and "line 2" in msg


def test_nested_duplicate_key_is_refused(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    text = path.read_text().replace("    lr: 0.003\n", "    lr: 0.003\n    lr: 0.1\n", 1)
    path.write_text(text)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "lr: 0.003" in line)
    with pytest.raises(ForgeError, match=rf"line {first + 1}: duplicate key 'lr' \(first at line {first}\)"):
        load_recipe(path)


def test_non_utf8_recipe_names_file_line_and_byte(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    data = path.read_bytes().replace(b"name: tiny", b"name: ti\xffny", 1)
    path.write_bytes(data)
    with pytest.raises(ForgeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert str(path) in msg and "not UTF-8" in msg and "line 1" in msg and "byte 8" in msg


def test_deep_nesting_is_a_clear_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ForgeError, match="nest"):
        load_recipe(path)


def test_unhashable_and_odd_keys_are_errors_not_crashes(tmp_path):
    for body in ["? [a, b]\n: c\n", "{1: 2, 3: [4]}\n", "!!python/object:os.system {}\n", "name: !!binary aGk=\n"]:
        path = tmp_path / "odd.yaml"
        path.write_text(body)
        with pytest.raises(ForgeError):
            load_recipe(path)


def test_a_huge_recipe_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: x\n# " + "y" * (2 << 20) + "\n")
    with pytest.raises(ForgeError, match="too big for a recipe"):
        load_recipe(path)

