"""Data sources: read documents lazily from local files, folders, globs or saved `datasets`.

Each source yields ``(record_number, text)`` pairs one at a time (a 10 GB JSONL never sits in
memory) and has a content fingerprint: a hash of its bytes plus the reader settings, recorded in
the lineage and in MLflow. Bad records raise ForgeError naming the file and line.
"""
from __future__ import annotations

import glob
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from forge.data.readers import hub_rows, is_gz, read_file, read_jsonl, saved_dataset_rows
from forge.errors import ForgeError


def _suffix(path: Path) -> str:
    """'.jsonl' for both data.jsonl and data.jsonl.gz."""
    return path.suffixes[-2].lower() if path.suffix.lower() == ".gz" and len(path.suffixes) > 1 else path.suffix.lower()


_SUFFIX_FORMAT = {
    ".txt": "text", ".md": "text", ".text": "text",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
    ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow",
}


DATA_SUFFIXES = tuple(_SUFFIX_FORMAT) + tuple(f"{s}.gz" for s in _SUFFIX_FORMAT)  # what a folder's listing reads
_BINARY = ("parquet", "arrow")  # read by pyarrow / datasets from the file itself, never through gzip


@dataclass(frozen=True)
class Source:
    """A resolved data source: its files, how to read them, and its fingerprint."""

    name: str
    files: tuple[Path, ...]
    format: str  # resolved per source; "auto" resolved per file
    text_fields: tuple[str, ...]
    split: str
    proprietary: bool
    saved_dataset: Path | None = None
    holdout: float = 0.05  # fraction of documents held out for evaluation
    hub: str | None = None
    hub_split: str = "train"
    on_error: str = "fail"
    max_errors: int = 100
    skipped: dict = field(default_factory=dict, compare=False)  # (file, line) -> reason, for on_error: skip
    chat: object = field(default=None, compare=False)  # forge.data.formats.FormatSpec of chat records, else None
    hub_revision: str | None = None      # a hub dataset's pinned revision (branch, tag or commit)
    hub_data_files: str | None = None    # a hub dataset's files to read (a glob in the repository)
    max_records: int | None = None       # read at most this many records
    max_tokens: int | None = None        # read at most about this many tokens (CHARS_PER_TOKEN characters each)
    token_dir: Path | None = field(default=None, compare=False)  # where its token ids are cached (None: encoded as read)
    workers: int = field(default=1, compare=False)  # processes that encode (and clean) it
    split_key: str | None = None         # what the held-out split hashes (default: the name; see holdout_key)

    @property
    def holdout_key(self) -> str:
        """The name the stable held-out split hashes with each record number (forge.data.mixing.in_holdout):
        the source's own, or for a curated set the set's, so every recipe source drawn from one curated
        set holds out the records its family held out, whatever the recipe calls it."""
        return self.split_key or self.name

    @property
    def location(self) -> str:
        """Where the source lives, for MLflow dataset inputs and lineage."""
        if self.hub:
            return f"hf://datasets/{self.hub}" + (f"@{self.hub_revision}" if self.hub_revision else "")
        if self.saved_dataset is not None:
            return str(self.saved_dataset)
        return str(self.files[0] if len(self.files) == 1 else self.files[0].parent)

    def records(self) -> Iterator[tuple[int, str]]:
        """Yield (record number, text); record numbers count from 1 across the source's files.
        A bad record raises ForgeError naming file and line, or with on_error: skip is counted."""
        for n, (path, line, item) in enumerate(self._items(), start=1):
            try:
                text = self.text_of(path, line, item)
            except ForgeError as e:
                self.skip(path, line, e)
                continue
            yield n, text

    def text_of(self, path, line: int, item: str | dict | ForgeError) -> str:
        """A read item as the record's text; a bad one raises ForgeError naming file and line."""
        if isinstance(item, ForgeError):  # the reader's stand-in for a bad line
            raise item
        if isinstance(item, str):
            return item
        return self._chat_text(item, path, line) if self.chat is not None else self._text(item, path, line)

    @property
    def splittable(self) -> bool:
        """Whether workers may read this source by byte ranges of its files (uncompressed JSONL with
        no record or token budget: a line is a record and a range starts at a line)."""
        if self.hub is not None or self.saved_dataset is not None or self.max_records or self.max_tokens:
            return False
        return all(not is_gz(p) and self._format_of(p) == "jsonl" for p in self.files)

    def range_items(self, path: Path, start: int, end: int, first_line: int
                    ) -> Iterator[tuple[int, str | dict | ForgeError]]:
        """(line, row) of the JSONL lines starting in bytes [start, end) of `path` (`start` is a
        line start, `first_line` its line number): what `records` reads there."""
        return read_jsonl(path, start, end, first_line)

    def rows(self) -> Iterator[tuple[int, str, dict | str | ForgeError]]:
        """Yield (record number, 'file:line N', row) for structured records (SFT and preference
        formats read their own fields); a bad line comes as a ForgeError in place of its row."""
        for n, (path, line, item) in enumerate(self._items(), start=1):
            yield n, f"{path}:line {line}", item

    def _items(self) -> Iterator[tuple[Path | str, int, str | dict | ForgeError]]:
        """Every item, within the source's record and token budgets."""
        chars, budget = 0, None if self.max_tokens is None else self.max_tokens * CHARS_PER_TOKEN
        for n, item in enumerate(self._all_items(), start=1):
            if (self.max_records is not None and n > self.max_records) or (budget is not None and chars >= budget):
                return
            chars += _chars(item[2])
            yield item

    def _all_items(self) -> Iterator[tuple[Path | str, int, str | dict | ForgeError]]:
        if self.hub is not None:
            for i, row in enumerate(hub_rows(self.hub, self.hub_split, self.hub_revision, self.hub_data_files),
                                    start=1):
                yield self.location, i, row
        elif self.saved_dataset is not None:
            for i, row in enumerate(saved_dataset_rows(self.saved_dataset), start=1):
                yield self.saved_dataset, i, row
        else:
            for path in self.files:
                for line, item in read_file(path, self._format_of(path), self.split, self.text_fields, self.name):
                    yield path, line, item

    def lines_of(self, numbers: set[int]) -> dict[int, str]:
        """`file:line` of each of these record numbers: one read of the source up to the last of
        them (only to name the records of a bad batch)."""
        found: dict[int, str] = {}
        for n, (path, line, _) in enumerate(self._items(), start=1):
            if n in numbers:
                found[n] = f"{path}:{line}"
            if len(found) == len(numbers):
                break
        return found

    def skip(self, path, line: int, error: ForgeError) -> None:
        """Count a bad record (on_error: skip), or raise it (fail, or past max_errors)."""
        if self.on_error != "skip":
            raise error
        self.skipped[(str(path), line)] = str(error)
        if len(self.skipped) > self.max_errors:
            raise ForgeError(f"data.{self.name}: more than max_errors={self.max_errors} bad records "
                             f"(on_error: skip); the last: {error}")

    def _format_of(self, path: Path) -> str:
        if self.format != "auto":
            return self.format
        fmt = _SUFFIX_FORMAT.get(_suffix(path))
        if fmt is None:
            raise ForgeError(f"{path}: cannot tell the format from the suffix {path.suffix!r}; set data.{self.name}.format")
        if fmt in _BINARY and is_gz(path):
            raise ForgeError(f"{path}: a gzip-compressed {fmt} file is not read ({fmt} compresses inside the file); "
                             "decompress it (gunzip)")
        return fmt

    def _text(self, row: dict, path: Path, line: int) -> str:
        parts = []
        for key in self.text_fields:
            if key not in row:
                raise ForgeError(
                    f"{path}:line {line}: record has no field {key!r} (data.{self.name}.text_field); "
                    f"fields present: {sorted(map(str, row))[:12]}"
                )
            value = row[key]
            if not isinstance(value, str):
                raise ForgeError(f"{path}:line {line}: field {key!r} should be text, got {type(value).__name__}")
            parts.append(value)
        return "\n".join(parts)

    def _chat_text(self, row: dict, path: Path, line: int) -> str:
        """A chat record as plain text (a text stage replaying instruction data): one `role: content`
        line per message, as forge's default chat template renders them."""
        from forge.data.formats import to_messages

        return "\n".join(f"{m['role']}: {m['content']}" for m in to_messages(row, self.chat, f"{path}:line {line}"))

    def fingerprint(self) -> str:
        """sha256 of every file's bytes, in order, plus the reader settings (a hub source: its id)."""
        h = hashlib.sha256()
        settings = {"format": self.format, "text_fields": self.text_fields, "split": self.split,
                    "hub": self.hub, "hub_split": self.hub_split}
        budget = {"hub_revision": self.hub_revision, "hub_data_files": self.hub_data_files,
                  "max_records": self.max_records, "max_tokens": self.max_tokens}
        settings.update({k: v for k, v in budget.items() if v is not None})  # unchanged for sources without
        h.update(json.dumps(settings, sort_keys=True).encode())
        for path in self.files:
            h.update(path.name.encode())
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)


def find_files(path: str) -> tuple[Path, ...]:
    """The readable files a path names: a file, every data file under a folder, or a glob's matches."""
    root = Path(path)
    if root.is_dir():
        return tuple(sorted(p for p in root.rglob("*") if p.is_file() and _suffix(p) in _SUFFIX_FORMAT))
    if root.is_file():
        return (root,)
    return tuple(sorted(Path(p) for p in glob.glob(path, recursive=True) if Path(p).is_file()))


def is_saved_dataset(path: str) -> bool:
    root = Path(path)
    return root.is_dir() and ((root / "dataset_info.json").is_file() or (root / "dataset_dict.json").is_file())


CHARS_PER_TOKEN = 4  # a token budget read without a tokenizer: ~4 characters of English text per token
# (OpenAI, "What are tokens and how to count them": one token is about 4 characters of English)


def _chars(item: object) -> int:
    """Characters of text in an item (a row's string values, nested ones too)."""
    if isinstance(item, str):
        return len(item)
    if isinstance(item, dict):
        return sum(_chars(v) for v in item.values())
    if isinstance(item, list):
        return sum(_chars(v) for v in item)
    return 0


def name_records(sources: dict[str, Source], records: list[tuple[str, int]]) -> list[str]:
    """(source, record number) pairs as `source file:line`, in order (`source record N` where the
    source is not known here)."""
    lines = {name: sources[name].lines_of({n for s, n in records if s == name})
             for name in {s for s, _ in records} if name in sources}
    return [f"{s} {lines[s][n]}" if n in lines.get(s, {}) else f"{s} record {n}" for s, n in records]
