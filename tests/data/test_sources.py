"""Sources: every reader, fingerprints, and bad input named by file and line."""
from __future__ import annotations

import json

import pytest

from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource


def _texts(tmp_path, name, **cfg):
    return [t for _, t in resolve_source(name, DataSource(**cfg), tmp_path / "gen").records()]


def test_text_split_modes(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("one\ntwo\n\nthree\n\n\nfour\n")
    assert _texts(tmp_path, "t", path=str(p)) == ["one\ntwo", "three", "four"]
    assert _texts(tmp_path, "t", path=str(p), split="line") == ["one", "two", "three", "four"]
    assert _texts(tmp_path, "t", path=str(p), split="file") == ["one\ntwo\n\nthree\n\n\nfour\n"]


def test_jsonl_json_csv_parquet_and_fields(tmp_path):
    rows = [{"q": "why?", "a": "because", "n": 1}, {"q": "how?", "a": "so", "n": 2}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    (tmp_path / "d.csv").write_text("q,a\nwhy?,because\nhow?,so\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    want = ["why?\nbecause", "how?\nso"]
    for suffix in ("jsonl", "json", "csv", "parquet"):
        assert _texts(tmp_path, "d", path=str(tmp_path / f"d.{suffix}"), text_field=["q", "a"]) == want, suffix


def test_glob_folder_and_saved_dataset(tmp_path):
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"{i}.md").write_text(f"doc {i}")
    assert _texts(tmp_path, "g", path=str(tmp_path / "docs" / "*.md")) == ["doc 0", "doc 1", "doc 2"]
    assert _texts(tmp_path, "f", path=str(tmp_path / "docs")) == ["doc 0", "doc 1", "doc 2"]
    from datasets import Dataset

    Dataset.from_dict({"body": ["x y", "z"]}).save_to_disk(str(tmp_path / "saved"))
    assert _texts(tmp_path, "s", path=str(tmp_path / "saved"), text_field="body") == ["x y", "z"]


def test_fingerprint_changes_with_bytes_and_settings(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "a"}\n')
    one = resolve_source("a", DataSource(path=str(p)), tmp_path).fingerprint()
    assert one == resolve_source("a", DataSource(path=str(p)), tmp_path).fingerprint()
    assert one != resolve_source("a", DataSource(path=str(p), text_field="body"), tmp_path).fingerprint()
    p.write_text('{"text": "b"}\n')
    assert one != resolve_source("a", DataSource(path=str(p)), tmp_path).fingerprint()


def test_reading_is_lazy(tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(1000)) + "{broken\n")
    records = resolve_source("big", DataSource(path=str(p)), tmp_path).records()
    assert next(records) == (1, "row 0")  # the broken last line is not read yet


@pytest.mark.parametrize("content, expected", [
    ('{"text": "ok"}\n{"text": oops}\n', "bad.jsonl:line 2: malformed JSON"),
    ('{"text": "ok"}\n{"body": "x"}\n', "bad.jsonl:line 2: record has no field 'text'"),
    ('{"text": "ok"}\n[1, 2]\n', "bad.jsonl:line 2: expected a JSON object"),
    ('{"text": 5}\n', "bad.jsonl:line 1: field 'text' should be text"),
])
def test_bad_records_name_file_and_line(tmp_path, content, expected):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(ForgeError, match=expected.replace("[", r"\[")):
        list(resolve_source("bad", DataSource(path=str(p)), tmp_path).records())


def test_not_utf8_is_named(tmp_path):
    p = tmp_path / "latin.txt"
    p.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ForgeError, match="latin.txt:line 1: not UTF-8"):
        list(resolve_source("l", DataSource(path=str(p)), tmp_path).records())


def test_unknown_suffix_asks_for_format(tmp_path):
    p = tmp_path / "data.bin"
    p.write_text("x")
    with pytest.raises(ForgeError, match="set data.b.format"):
        list(resolve_source("b", DataSource(path=str(p)), tmp_path).records())


def test_skip_mode_counts_bad_lines_and_caps(tmp_path):
    p = tmp_path / "mixed.jsonl"
    p.write_bytes(b'{"text": "a"}\n{oops\n{"body": "x"}\n{"text": "caf\xe9"}\n{"text": "b"}\n')
    src = resolve_source("m", DataSource(path=str(p), on_error="skip"), tmp_path)
    assert [t for _, t in src.records()] == ["a", "b"]
    assert sorted(line for _, line in src.skipped) == [2, 3, 4]
    assert "not UTF-8" in src.skipped[(str(p), 4)]
    capped = resolve_source("m", DataSource(path=str(p), on_error="skip", max_errors=2), tmp_path)
    with pytest.raises(ForgeError, match="more than max_errors=2 bad records"):
        list(capped.records())


def test_hub_source_offline_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = resolve_source("hub", DataSource(hub="org/some-dataset"), tmp_path)
    assert src.location == "hf://datasets/org/some-dataset"
    with pytest.raises(ForgeError, match="needs network access"):
        list(src.records())
