"""Cheap checks of a base checkpoint folder at validate time, so a broken base is named before any
work starts: config.json parses, weights come as safetensors whose header and length agree (a 0-byte
or truncated file is caught by reading 8 bytes and the JSON header, never the tensors; a header
length larger than the file is refused before it is read; only regular files are opened), every shard
an index names exists, and tokenizer files are present. A path that does not exist is said to be
missing (with, under `shared/data`, where that folder comes from), not to be a bad checkpoint.
"""
from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import Any, BinaryIO

# Files any Hugging Face tokenizer loads from; one is enough (tokenizer_config.json alone is not).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "vocab.json", "vocab.txt")
_MAX_HEADER = 100 << 20  # the safetensors format caps its JSON header at 100 MB
SHARED_DATA = ("shared", "data")  # the real model and data kept beside the checkout (README.md, "Two commands")


def absent(path: str | Path) -> str:
    """Why a path the recipe names is not there: it does not exist; under a `shared/data` folder,
    also whether that folder itself is missing and where to set it up (README.md)."""
    path = Path(path)
    parts = path.parts
    at = next((i for i in range(len(parts) - 1) if parts[i:i + 2] == SHARED_DATA), None)
    if at is None:
        return "does not exist"
    root = Path(*parts[:at + 2])
    if not root.is_dir():
        return (f"does not exist: the shared/data folder {root} is missing (the real model and data some recipes "
                "use, kept beside the checkout as ../shared/data; README.md, section \"Two commands\", says how "
                "to set it up)")
    return f"does not exist in {root} (its README.md lists what that folder holds; README.md, \"Two commands\")"


class NotRegularFile(OSError):
    """A path that names a FIFO, socket, device or folder where a file was expected."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file (symlinks followed). A FIFO would block the
    reader until a writer comes and a device may never end, so the file is opened without blocking
    and its type checked on the open descriptor (no window for a swap) before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise NotRegularFile(f"{path}: not a regular file ({kind})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: str | Path) -> Any:
    """A regular file's JSON (OSError, including NotRegularFile, or ValueError otherwise)."""
    with open_regular(path) as f:
        return json.loads(f.read())


class HeaderError(ValueError):
    """Why a file is not a complete safetensors file (the words after its name)."""


def read_header(path: str | Path) -> tuple[dict[str, Any], int, int]:
    """A safetensors file's JSON header, where its tensor data starts (8 + the header's length) and
    the file's size, reading the header only. Its declared
    length is checked against the format's 100 MB cap and the file's size before it is read, so a
    crafted length (2**60) costs nothing. HeaderError says what is wrong; OSError if unreadable."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise HeaderError("is empty (0 bytes)")
        if size < 8:
            raise HeaderError(f"is truncated ({size} bytes; not even the 8-byte header length)")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _MAX_HEADER or 8 + n > size:
            raise HeaderError(f"is truncated or not safetensors (header says {n} bytes, the file has {size})")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise HeaderError("has an unreadable header (not safetensors JSON)") from None
    if not isinstance(header, dict):
        raise HeaderError("has an unreadable header (not a JSON object)")
    return header, 8 + n, size


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a complete safetensors file, or None. Reads the header only."""
    try:
        header, start, size = read_header(path)
    except HeaderError as e:
        return str(e)
    except NotRegularFile as e:
        return "is " + str(e).removeprefix(f"{path}: ")
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"has an unreadable header (tensor {name!r} has no data_offsets)"
        end = max(end, offsets[1])
    if start + end != size:
        return f"is truncated ({size} bytes; its header describes {start + end})"
    return None


def outside_shards(names: Any) -> list[str]:
    """The shard names of an index's weight_map that would leave the checkpoint folder (absolute, with
    a `..` or empty segment, a backslash or a NUL) or are not strings: a crafted index must not make
    forge read a file elsewhere. A shard is a file name or a relative path below the folder."""
    bad = []
    for name in names:
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or any(part in ("", ".", "..") for part in parts) or "\\" in name or "\0" in name:
            bad.append(repr(name))
    return bad


def _weight_files(folder: Path) -> tuple[list[Path], list[str]]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(read_json(index)["weight_map"].values()), key=str)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return [], [f"{index.name} is not a valid safetensors index (no weight_map)"]
        outside = outside_shards(shards)
        if outside:
            return [], [f"{index.name} names shard(s) outside the folder: {', '.join(outside)}"]
        missing = [s for s in shards if not (folder / s).is_file()]
        problems = [f"{index.name} names shard(s) that are missing: {missing}"] if missing else []
        return [folder / s for s in shards if s not in missing], problems
    return sorted(folder.glob("*.safetensors")), []


def check_base(folder: str | Path) -> list[str]:
    """Problems with a base checkpoint folder, each naming the file (empty list: looks loadable)."""
    folder = Path(folder)
    problems = []
    try:
        read_json(folder / "config.json")
    except NotRegularFile as e:
        problems.append("config.json is " + str(e).removeprefix(f"{folder / 'config.json'}: "))
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        problems.append(f"config.json is not readable JSON ({type(e).__name__}: {str(e)[:80]})")
    weights, index_problems = _weight_files(folder)
    problems += index_problems
    if not weights and not index_problems:
        pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        found = f" (found {pickles}: pickle files, which forge does not load)" if pickles else ""
        problems.append(f"no *.safetensors weights{found}; forge loads weights only from safetensors "
                        "(convert with transformers: model.save_pretrained(dir, safe_serialization=True))")
    for path in weights:
        why = safetensors_problem(path)
        if why:
            problems.append(f"{path.name} {why}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer files (expected one of {list(TOKENIZER_FILES)}); copy the tokenizer "
                        "into the checkpoint folder (tokenizer.save_pretrained(dir))")
    return [f"{folder}: {p}" for p in problems]
