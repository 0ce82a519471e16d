"""File readers for data sources: plain text, JSONL (whole or a byte range), JSON, CSV and their .gz
forms, Hugging Face Hub datasets and saved `datasets` folders; each yields (line, item) with a bad
line as a ForgeError naming the file and line (forge.data.sources decides what a record's text is)."""
from __future__ import annotations

import csv
import gzip
import json
import zlib
from pathlib import Path
from typing import Iterator

from forge.errors import ForgeError


def read_file(path: Path, fmt: str, split: str, fields: tuple[str, ...] = (), name: str = ""
               ) -> Iterator[tuple[int, str | dict | ForgeError]]:
    try:
        if fmt == "text":
            yield from _read_text(path, split)
        elif fmt == "jsonl":
            yield from read_jsonl(path)
        elif fmt == "json":
            yield from _read_json(path)
        elif fmt == "csv":
            yield from _read_csv(path, fields, name)
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            n = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    n += 1
                    yield n, row
        elif fmt == "arrow":
            from datasets import Dataset

            for n, row in enumerate(Dataset.from_file(str(path)), start=1):
                yield n, row
        else:
            raise ForgeError(f"{path}: unknown format {fmt!r}")
    except UnicodeDecodeError:
        raise _utf8_error(path) from None
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz, an unreadable file
        raise ForgeError(f"{path}: cannot read {fmt} data: {e}") from None
    except Exception as e:  # pyarrow / datasets on a corrupt file: named, not a traceback
        if type(e).__module__.split(".")[0] not in ("pyarrow", "datasets"):
            raise
        raise ForgeError(f"{path}: not a readable {fmt} file: {e}") from None


def is_gz(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def _open_text(path: Path, newline: str | None = None):
    """A text file as UTF-8, decompressed on the fly when it ends in .gz (every text format)."""
    if is_gz(path):
        return gzip.open(path, "rt", encoding="utf-8", newline=newline)
    return open(path, encoding="utf-8", newline=newline)


def _utf8_error(path: Path) -> ForgeError:
    """Find the first bad byte by line (text readers decode in 8 KB chunks, so their offset is
    not the file's); only runs once reading has already failed."""
    offset = 0
    with (gzip.open(path, "rb") if is_gz(path) else open(path, "rb")) as f:
        for i, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return ForgeError(f"{path}:line {i}: not UTF-8 text (byte {offset + e.start} of the file, "
                                  f"column {e.start + 1}): {e.reason}")
            offset += len(raw)
    return ForgeError(f"{path}: not UTF-8 text")


def _read_csv(path: Path, fields: tuple[str, ...], name: str) -> Iterator[tuple[int, dict | ForgeError]]:
    """Rows as dicts by header; a row whose column count differs from the header's comes as a
    ForgeError naming its first line (quoted fields may span lines, so lines are counted by csv)."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # a long document is one big field
    with _open_text(path, newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                return
            missing = [k for k in fields if k not in header]
            if missing:
                raise ForgeError(f"{path}:line 1: the CSV header has no column {missing[0]!r} "
                                 f"(data.{name}.text_field); columns: {header[:12]}")
            last = reader.line_num
            for values in reader:
                start, last = last + 1, reader.line_num
                if not values:
                    continue
                if len(values) != len(header):
                    yield start, ForgeError(f"{path}:line {start}: {len(values)} columns, the header has "
                                            f"{len(header)} ({', '.join(header[:6])})")
                else:
                    yield start, dict(zip(header, values))
        except csv.Error as e:
            raise ForgeError(f"{path}:line {reader.line_num}: malformed CSV: {e}") from None


def _read_text(path: Path, split: str) -> Iterator[tuple[int, str]]:
    with _open_text(path) as f:
        if split == "file":
            text = f.read()
            if text.strip():
                yield 1, text
            return
        if split == "line":
            for i, line in enumerate(f, start=1):
                if line.strip():
                    yield i, line.rstrip("\n")
            return
        buf: list[str] = []
        start = 1
        for i, line in enumerate(f, start=1):
            if line.strip():
                if not buf:
                    start = i
                buf.append(line)
            elif buf:
                yield start, "".join(buf).rstrip("\n")
                buf = []
        if buf:
            yield start, "".join(buf).rstrip("\n")


_SKIP = 1 << 20  # bytes read at a time past a line over the limit


def _lines(f, limit: int | None) -> Iterator[tuple[bytes | None, int]]:
    """(line, its length in bytes) for each line of a binary file, split on b'\\n' only (a bare
    '\\r' is JSON whitespace, not a line end); a line longer than `limit` bytes (its newline not
    counted) comes as None, read past a piece at a time and never held whole."""
    if limit is None:
        for raw in f:
            yield raw, len(raw)
        return
    while raw := f.readline(limit + 1):
        if raw.endswith(b"\n") or len(raw) <= limit:
            yield raw, len(raw)
            continue
        size, raw = len(raw), b""
        while rest := f.readline(_SKIP):
            size += len(rest)
            if rest.endswith(b"\n"):
                break
        yield None, size


def read_jsonl(path: Path, start: int = 0, end: int | None = None, first_line: int = 1,
               max_line: int | None = None) -> Iterator[tuple[int, dict | ForgeError]]:
    """Rows, or a ForgeError in place of a bad line (the caller fails or skips it); with `start` and
    `end`, the lines that start in that byte range (`start` at a line start numbered `first_line`).
    With `max_line`, a line over that many bytes is a ForgeError too (training reads any length:
    long records are encoded a window at a time; `forge data check` bounds its memory)."""
    with (gzip.open(path, "rb") if is_gz(path) else open(path, "rb")) as f:
        if start:
            f.seek(start)
        pos = start
        for i, (raw, size) in enumerate(_lines(f, max_line), start=first_line):
            if end is not None and pos >= end:
                return
            pos += size
            if raw is None:
                yield i, ForgeError(f"{path}:line {i}: too long: {size:,} bytes, over the limit of {max_line:,}")
                continue
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield i, ForgeError(f"{path}:line {i}: not UTF-8 text (column {e.start + 1}): {e.reason}")
                continue
            except json.JSONDecodeError as e:
                yield i, ForgeError(f"{path}:line {i}: malformed JSON ({e.msg} at column {e.colno})")
                continue
            except (ValueError, RecursionError) as e:  # digits past int's limit, nesting past the stack
                yield i, ForgeError(f"{path}:line {i}: JSON this reader refuses ({type(e).__name__}: {str(e)[:80]})")
                continue
            if not isinstance(row, dict):
                row = ForgeError(f"{path}:line {i}: expected a JSON object, got {type(row).__name__}")
            yield i, row


def _read_json(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        with _open_text(path) as f:
            rows = json.loads(f.read())
    except json.JSONDecodeError as e:
        raise ForgeError(f"{path}:line {e.lineno}: malformed JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:  # digits past int's limit, nesting past the stack
        raise ForgeError(f"{path}: JSON this reader refuses ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(rows, list):
        raise ForgeError(f"{path}: expected a JSON array of objects")
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise ForgeError(f"{path}: item {i}: expected a JSON object, got {type(row).__name__}")
        yield i, row


def hub_rows(dataset_id: str, split: str, revision: str | None = None, data_files: str | None = None
              ) -> Iterator[dict]:
    """A hub dataset, streamed (never downloaded whole) at `revision`, its `data_files` only when
    given; needs network."""
    import os

    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise ForgeError(f"hub dataset {dataset_id!r} needs network access, but offline mode is set "
                         "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); use a local copy (datasets save_to_disk) instead")
    from datasets import load_dataset

    extra = {k: v for k, v in (("revision", revision), ("data_files", data_files)) if v is not None}
    try:
        yield from load_dataset(dataset_id, split=split, streaming=True, **extra)
    except (OSError, ValueError, ConnectionError) as e:
        at = f"@{revision}" if revision else ""
        raise ForgeError(f"hub dataset {dataset_id!r}{at} (split {split!r}) could not be read: {e}") from None


def saved_dataset_rows(root: Path) -> Iterator[dict]:
    from datasets import load_from_disk

    ds = load_from_disk(str(root))
    if hasattr(ds, "keys"):  # a DatasetDict: use its train split, else the first one
        ds = ds["train"] if "train" in ds else ds[next(iter(ds.keys()))]
    yield from ds
