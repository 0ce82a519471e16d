"""Hostile data files: each bad input is a ForgeError naming the file and the line, never a crash."""
from __future__ import annotations

import gzip
import json

import pytest

from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource


def _read(tmp_path, path, **cfg):
    return [t for _, t in resolve_source("s", DataSource(path=str(path), **cfg), tmp_path / "gen").records()]


@pytest.mark.parametrize("split", ["paragraph", "line", "file"])
def test_bad_byte_deep_in_text_is_located_by_line_and_file_offset(tmp_path, split):
    path = tmp_path / "notes.txt"
    good = "".join(f"line {i} of plain text\n" for i in range(1, 5001))  # ~110 KB, past any read chunk
    data = good.encode() + b"the bad one: caf\xe9\n" + b"more\n"
    path.write_bytes(data)
    with pytest.raises(ForgeError) as err:
        _read(tmp_path, path, split=split)
    msg = str(err.value)
    offset = data.index(b"\xe9")
    assert f"{path}:line 5001" in msg and f"byte {offset}" in msg and "column 17" in msg, msg


def test_csv_row_with_an_extra_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("q,text\nwhy,because\nhow,so,EXTRA\n")
    with pytest.raises(ForgeError, match=rf"{path}:line 3: 3 columns, the header has 2"):
        _read(tmp_path, path)


def test_csv_row_with_a_missing_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("q,text\nwhy,because\nhow\n")
    with pytest.raises(ForgeError, match=rf"{path}:line 3: 1 columns?, the header has 2"):
        _read(tmp_path, path)


def test_csv_without_the_text_field(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("q,answer\nwhy,because\n")
    with pytest.raises(ForgeError, match=rf"{path}:line 1: .*no column 'text' \(data.s.text_field\).*answer"):
        _read(tmp_path, path)


def test_csv_multiline_field_keeps_true_line_numbers(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('text\n"a\nb\nc"\n"x",1\n')
    with pytest.raises(ForgeError, match=rf"{path}:line 5:"):
        _read(tmp_path, path)


def test_csv_nul_and_giant_field(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"text\nfine\nbad\x00row\n")
    assert _read(tmp_path, path) == ["fine", "bad\x00row"]  # Python >= 3.11's csv reads NUL
    giant = "x" * 300_000
    path.write_text(f"text\n{giant}\n")
    assert _read(tmp_path, path) == [giant]


def test_json_nesting_bombs_and_huge_numbers_are_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "ok"}\n' + "[" * 100_000 + "\n")
    with pytest.raises(ForgeError, match=rf"{path}:line 2"):
        _read(tmp_path, path)
    path.write_text('{"text": "ok", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(ForgeError, match=rf"{path}:line 1"):
        _read(tmp_path, path)
    path = tmp_path / "t.json"
    path.write_text("[" * 100_000)
    with pytest.raises(ForgeError, match=str(path)):
        _read(tmp_path, path)


def test_corrupt_gzip_and_parquet_are_named(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    whole = gzip.compress("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(5000)).encode())
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ForgeError, match=str(path)):
        _read(tmp_path, path)
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(ForgeError, match=str(path)):
        _read(tmp_path, path)


def test_non_string_keys_in_missing_field_message(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"1": "x", "body": "y"}) + "\n")
    with pytest.raises(ForgeError, match=rf"{path}:line 1: record has no field 'text'"):
        _read(tmp_path, path)
