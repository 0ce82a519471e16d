"""Cheap checks of a base checkpoint folder at validate time, so a broken base is named before any
work starts: config.json parses, weights come as safetensors whose header and length agree (a 0-byte
or truncated file is caught by reading 8 bytes and the JSON header, never the tensors), every shard
an index names exists, and tokenizer files are present. A path that does not exist is said to be
missing (with, under `shared/data`, where that folder comes from), not to be a bad checkpoint.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

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


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a complete safetensors file, or None. Reads the header only."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    if size < 8:
        return f"is truncated ({size} bytes; not even the 8-byte header length)"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _MAX_HEADER or 8 + n > size:
            return f"is truncated or not safetensors (header says {n} bytes, the file has {size})"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return "has an unreadable header (not safetensors JSON)"
    if not isinstance(header, dict):
        return "has an unreadable header (not a JSON object)"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"has an unreadable header (tensor {name!r} has no data_offsets)"
        end = max(end, offsets[1])
    if 8 + n + end != size:
        return f"is truncated ({size} bytes; its header describes {8 + n + end})"
    return None


def _weight_files(folder: Path) -> tuple[list[Path], list[str]]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return [], [f"{index.name} is not a valid safetensors index (no weight_map)"]
        missing = [s for s in shards if not (folder / s).is_file()]
        problems = [f"{index.name} names shard(s) that are missing: {missing}"] if missing else []
        return [folder / s for s in shards if s not in missing], problems
    return sorted(folder.glob("*.safetensors")), []


def check_base(folder: str | Path) -> list[str]:
    """Problems with a base checkpoint folder, each naming the file (empty list: looks loadable)."""
    folder = Path(folder)
    problems = []
    try:
        json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
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
