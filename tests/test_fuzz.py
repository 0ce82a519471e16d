"""Fuzzing with hypothesis: mutated recipes against `load_recipe`, mutated data files against the
readers (and hygiene). Every case must end in success or a ForgeError: never another exception,
never a hang. Deterministic (derandomize) and with no example database, so CI runs the same
cases every time and writes nothing outside its temporary folder.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from forge.data.hygiene import Hygiene, HygieneConfig
from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource, load_recipe
from forge_testing import base_recipe

# hypothesis keeps a cache of constants under its home folder (./.hypothesis by default): a temp one
_HOME = tempfile.mkdtemp(prefix="forge-hypothesis-")
set_hypothesis_home_dir(_HOME)
CASES = int(__import__("os").environ.get("FORGE_FUZZ_CASES", "1000"))
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
COUNT: dict[str, int] = {}


@pytest.fixture(scope="module")
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="forge-fuzz-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(_HOME, ignore_errors=True)


# ------------------------------------------------------------------------------------- recipes
_EXTREME = st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 10**30, 1e308, float("inf"), float("-inf"),
                            float("nan"), 1e-320, -0.0, True, False, None])
_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", ".", "..", "/", "../../etc", "~", "a\x00b",
                                                         "\u202e", "名前", "🦙" * 30, "catalog://x"]),
                  st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(1000, 5000)))
_SCALAR = st.one_of(_EXTREME, st.integers(), st.floats(), _TEXT, st.binary(max_size=20))
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=12)


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _paths(v, prefix + (i,))


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # the fuzzer's own writing, kept fast


@st.composite
def mutated_recipe(draw) -> bytes:
    recipe = base_recipe(Path("/tmp/forge-fuzz-out"))
    for _ in range(draw(st.integers(0, 4))):
        paths = list(_paths(recipe))[1:]
        path = draw(st.sampled_from(paths))
        parent = recipe
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "unknown_key", "deep"]))
        if action == "replace":
            parent[path[-1]] = draw(_VALUE)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "unknown_key" and isinstance(parent, dict):
            parent[draw(_TEXT)] = draw(_VALUE)
        elif action == "deep":
            nested = draw(_SCALAR)
            for _ in range(draw(st.integers(1, 200))):
                nested = [nested] if draw(st.booleans()) else {"k": nested}
            parent[path[-1]] = nested
    try:
        text = yaml.dump(recipe, Dumper=_DUMPER, allow_unicode=draw(st.booleans()), sort_keys=False)
    except yaml.YAMLError:
        text = yaml.safe_dump(base_recipe(Path("/tmp/forge-fuzz-out")))
    edit = draw(st.sampled_from(["none", "alias", "bomb", "dup", "bytes", "truncate", "tag", "anchors", "huge"]))
    lines = text.splitlines(keepends=True)
    at = draw(st.integers(0, len(lines)))
    if edit == "alias":
        text = "x-base: &b {lr: 0.1}\n" + text.replace("optim:\n", "optim: *b\n", 1)
    elif edit == "bomb":
        levels = draw(st.integers(2, 12))
        bomb = "l0: &l0 [x]\n" + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i-1}'] * 9)}]\n" for i in range(1, levels))
        text = bomb + text.replace("stages:\n", f"stages: *l{levels - 1}\nold_stages:\n", 1)
    elif edit == "dup":
        text = "".join(lines[:at]) + (lines[at - 1] if at else "name: again\n") + "".join(lines[at:])
    elif edit == "huge":
        text += "# " + "x" * draw(st.integers(1 << 20, 2 << 20)) + "\n"
    elif edit == "bytes":
        junk = draw(st.binary(min_size=1, max_size=8))
        data = text.encode()
        pos = draw(st.integers(0, len(data)))
        return data[:pos] + junk + data[pos:]
    elif edit == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif edit == "tag":
        text = "".join(lines[:at]) + draw(st.sampled_from(["!!python/object/apply:os.system ['true']\n",
                                                           "x: !!binary aGVsbG8=\n", "y: !!set {a, b}\n",
                                                           "z: !custom 1\n", "? [a, b]\n: c\n"])) + "".join(lines[at:])
    elif edit == "anchors":
        text = "".join(lines[:at]) + "a: &a [*a]\n" + "".join(lines[at:])
    return text.encode("utf-8", "surrogatepass")


@pytest.mark.slow
@FUZZ
@given(text=mutated_recipe())
def test_fuzzed_recipes_load_or_fail_plainly(scratch, text):
    COUNT["recipes"] = COUNT.get("recipes", 0) + 1
    path = scratch / "recipe.yaml"
    path.write_bytes(text)
    try:
        load_recipe(path)
    except ForgeError as e:
        assert str(e).strip(), "a forge error must say something"


# ---------------------------------------------------------------------------------------- data
_FIELD_VALUE = st.one_of(st.text(max_size=60), _EXTREME, st.lists(st.integers(), max_size=3),
                         st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
_JSON_RECORD = st.dictionaries(st.sampled_from(["text", "body", "q", "", "\x00"]), _FIELD_VALUE, max_size=3)
_GIANT = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=3), st.integers(10_000, 100_000))
_CONTROL = st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl", "Zp", "Co"]), max_size=30)


@st.composite
def data_line(draw, fmt: str) -> bytes:
    kind = draw(st.sampled_from(["good", "broken", "bytes", "giant", "control", "nested"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40)).replace(b"\n", b" ")
    if kind == "broken":
        good = json.dumps(draw(_JSON_RECORD), allow_nan=True)
        return good[: draw(st.integers(0, len(good)))].encode()
    if kind == "nested":
        depth = draw(st.integers(1, 5000))
        return ("[" * depth + "]" * draw(st.integers(0, depth))).encode()
    text = {"good": st.text(max_size=80), "giant": _GIANT, "control": _CONTROL}[kind]
    value = draw(text).replace("\n", " ").replace("\r", " ")
    if fmt in ("jsonl", "json"):
        record = draw(_JSON_RECORD)
        record["text"] = value
        return json.dumps(record, ensure_ascii=draw(st.booleans())).encode()
    if fmt == "csv":
        cells = [value] + draw(st.lists(st.text(max_size=10).map(lambda s: s.replace("\n", " ")), max_size=2))
        return ",".join(f'"{c}"' if draw(st.booleans()) else c for c in cells).encode("utf-8", "surrogatepass")
    return value.encode("utf-8", "surrogatepass")


@st.composite
def data_file(draw) -> tuple[str, bytes, dict]:
    fmt = draw(st.sampled_from(["jsonl", "txt", "csv", "json"]))
    lines = draw(st.lists(data_line(fmt), max_size=6))
    if fmt == "csv" and draw(st.booleans()):
        lines.insert(0, draw(st.sampled_from([b"text", b"text,extra", b"q,a", b"", b"text,text"])))
    if fmt == "json":
        body = b"[" + b",".join(lines) + b"]" if draw(st.booleans()) else b"\n".join(lines)
    else:
        body = draw(st.sampled_from([b"\n", b"\r\n", b"\n\n"])).join(lines)
    if draw(st.booleans()):
        body = draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b""])) + body
    cfg = {"on_error": draw(st.sampled_from(["fail", "skip"])), "max_errors": draw(st.integers(0, 3)),
           "text_field": draw(st.sampled_from(["text", ["text", "body"], "body"])),
           "split": draw(st.sampled_from(["paragraph", "line", "file"]))}
    return fmt, body, cfg


@pytest.mark.slow
@FUZZ
@given(case=data_file())
def test_fuzzed_data_files_read_or_fail_plainly(scratch, case):
    COUNT["data"] = COUNT.get("data", 0) + 1
    fmt, body, cfg = case
    path = scratch / f"data.{fmt}"
    path.write_bytes(body)
    source = resolve_source("fz", DataSource(path=str(path), proprietary=True, **cfg), scratch / "gen")
    try:
        records = list(source.records())
        list(Hygiene(HygieneConfig()).process("fz", records))
    except ForgeError as e:
        assert str(path) in str(e) or "data.fz" in str(e), e


@pytest.mark.slow
def test_fuzz_case_counts():
    """Runs after the two fuzzers (file order): each ran its full count of cases."""
    if len(COUNT) < 2:
        pytest.skip("the fuzzers did not both run in this session")
    assert all(n >= CASES for n in COUNT.values()), COUNT


# ---------------------------------------------------------------------------------- export --out
# What is at --out (and beside it) is drawn; the export runs for real. It either writes --out (only
# where nothing or an earlier export was, with --overwrite for the latter) or fails with a ForgeError
# having changed nothing; in both cases nothing outside the export folder changes.
EXPORT_CASES = min(CASES, int(__import__("os").environ.get("FORGE_FUZZ_EXPORT_CASES", "60")))
_AT_OUT = ["missing", "file", "empty", "user", "export", "export+extra", "fake-marker", "link-export", "link-file",
           "dangling", "in-run", "in-lock", "in-novella", "run-itself", "dot", "dotdot", "deep-missing", "under-file"]


def _tree(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        st_ = p.lstat()
        kind = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
        out[str(p.relative_to(root))] = (kind, __import__("os").readlink(p) if kind == "link" else None,
                                         st_.st_size if kind == "file" else None,
                                         st_.st_mtime_ns if kind == "file" else st_.st_mode,  # a folder's mtime moves
                                         p.read_bytes() if kind == "file" and st_.st_size < 1 << 16 else None)
    return out


@pytest.fixture(scope="module")
def export_source(tiny_checkpoint, scratch):
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "export"))
    from export_fixtures import save_tiny
    from forge.export.layout import ExportOptions, export
    from forge.export.source import resolve

    model = save_tiny("llama", scratch / "export-src", tiny_checkpoint)
    src = resolve(str(model), None, scratch / "export-work")
    template = scratch / "export-template"
    export(src, template, ExportOptions(format="hf"), log=lambda *_: None)
    return src, template


@settings(FUZZ, max_examples=EXPORT_CASES)
@given(at=st.sampled_from(_AT_OUT), name=st.sampled_from(["e", "e e", "名前", "-rf", ".hidden", "x.partial"]),
       neighbours=st.sets(st.sampled_from(["NAME.partial", "NAME.old", ".NAME.forge-export-1-abcdefgh", "other"])),
       overwrite=st.booleans())
def test_fuzzed_export_paths_change_nothing_outside_the_export(export_source, scratch, at, name, neighbours, overwrite):
    import os

    from forge.export.destination import not_an_export
    from forge.export.layout import ExportOptions, export

    src, template = export_source
    box = Path(tempfile.mkdtemp(prefix="box-", dir=scratch))
    cwd = box / "cwd"
    cwd.mkdir()
    parent = box / "place"
    if at in ("in-run", "run-itself"):
        (parent / "stages").mkdir(parents=True)
        (parent / "run.json").write_text('{"status": "finished"}')
    elif at == "in-lock":
        parent.mkdir()
        (parent / ".forge.lock").write_text("")
    elif at == "in-novella":
        parent.mkdir()
        (parent / "lineage.json").write_text("{}")
    else:
        parent.mkdir()
    for n in neighbours:
        p = parent / n.replace("NAME", name)
        p.mkdir() if n.startswith(".") else p.write_text("a user's")
    out = {"dot": cwd, "dotdot": box, "run-itself": parent, "deep-missing": parent / "a" / "b" / name}.get(at, parent / name)
    if at in ("file", "link-file", "under-file"):
        (parent / "f.txt").write_text("a user's file")
    if at == "file":
        out.write_text("a user's file")
    elif at == "under-file":
        out = parent / "f.txt" / name
    elif at == "empty":
        out.mkdir()
    elif at == "user":
        out.mkdir()
        (out / "thesis.tex").write_text("years")
    elif at in ("export", "export+extra", "link-export", "fake-marker"):
        target = out if at != "link-export" else parent / "real-export"
        shutil.copytree(template, target)
        if at == "export+extra":
            (target / "notes.md").write_text("mine")
        if at == "fake-marker":
            (target / "forge-manifest.json").write_text("{}")
        if at == "link-export":
            out.symlink_to(target)
    elif at == "link-file":
        out.symlink_to(parent / "f.txt")
    elif at == "dangling":
        out.symlink_to(parent / "nowhere")
    given_out = Path(".") if at == "dot" else Path("..") if at == "dotdot" else out
    replaceable = at == "missing" or at == "deep-missing" or (at == "export" and overwrite)
    before = _tree(box)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        export(src, given_out, ExportOptions(format="hf", overwrite=overwrite), log=lambda *_: None)
        wrote = True
    except ForgeError as e:
        assert str(e).startswith(f"--out {given_out}") and "\n" not in str(e), e
        wrote = False
    finally:
        os.chdir(old)
    try:
        assert wrote == replaceable, (at, overwrite)
        if wrote:
            assert not_an_export(out) is None
            after = {k: v for k, v in _tree(box, skip=out).items() if k in before or box / k not in out.parents}
            assert after == {k: v for k, v in before.items() if not (box / k == out or out in (box / k).parents)}
        else:
            assert _tree(box) == before
    finally:
        shutil.rmtree(box, ignore_errors=True)
