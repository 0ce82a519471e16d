"""Every text format reads from a .gz file as from the plain one (issue 18, item 11): .txt.gz,
.csv.gz and .json.gz used to pass validation and then fail with "not UTF-8 text"."""
from __future__ import annotations

import gzip
import json

import pytest

from forge.data.sources import Source, find_files
from forge.errors import ForgeError

ROWS = [{"text": "the valve opens at dawn, ünïcode too"}, {"text": "second record"}]


def _write(path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    with gzip.open(path.with_name(path.name + ".gz"), "wt", encoding="utf-8", newline="") as f:
        f.write(text)


def _records(path) -> list[str]:
    src = Source("s", find_files(str(path)), "auto", ("text",), "line", False)
    return [t for _, t in src.records()]


@pytest.mark.parametrize("name, text", [
    ("a.txt", "".join(r["text"] + "\n" for r in ROWS)),
    ("a.csv", "text,other\n" + "".join(f"\"{r['text']}\",x\n" for r in ROWS)),
    ("a.json", json.dumps(ROWS)),
    ("a.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS)),
])
def test_gzipped_text_formats_read_as_the_plain_ones(tmp_path, name, text):
    _write(tmp_path / name, text)
    assert _records(tmp_path / (name + ".gz")) == _records(tmp_path / name) == [r["text"] for r in ROWS]


def test_gzipped_binary_formats_are_refused_naming_the_file(tmp_path):
    (tmp_path / "a.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(ForgeError, match=r"a\.parquet\.gz: .*gzip.*decompress"):
        _records(tmp_path / "a.parquet.gz")
