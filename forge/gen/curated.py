"""forge-tiny's curated sets as JSONL files (`generate: {kind: harvest_NAME}` in a recipe): general,
highquality and long text from the harvest (forge.gen.harvest) and forge's stories; skills (the
instruction tasks as text in the chat format), instructions and preferences from
forge.gen.instructions.

Every record is held out or not by its unit (a module, a story, a task's arguments), the same unit in
every set; the file puts the held-out records exactly at the record numbers that forge's stable
split (forge.data.mixing.in_holdout, keyed by the source's name and holdout) holds out. So no stage
trains on a held-out record of any set: a module held out of `general` is held out of `long` too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from forge.data.mixing import aligned
from forge.files import write_jsonl
from forge.gen import harvest

SETS = ("general", "highquality", "long", "skills", "instructions", "preferences")
HOLDOUT = 0.05          # the sets' held-out fraction (a recipe's data.NAME.holdout must say the same)
Stories = Callable[[int, int], list[str]]  # (count, seed) -> generated stories
STORY_SHARE = 8         # general: one generated story per this many records


def records(name: str, documents: int, seed: int, holdout: float = HOLDOUT, stories: Stories | None = None
            ) -> harvest.Flagged:
    """The set's records, each with whether it is held out, at most `documents` of them; `general`
    mixes in `stories(count, seed)` (forge.gen.generate's), one record in STORY_SHARE."""
    from forge.gen import instructions

    docs = harvest.harvest()
    if name == "general":
        told = stories(documents // STORY_SHARE, seed) if stories is not None else []
        flagged = harvest.general_set(docs, told, holdout, seed)
    elif name == "highquality":
        flagged = harvest.highquality_set(docs, holdout, seed)
    elif name == "long":
        flagged = harvest.long_set(docs, holdout, seed)
    elif name in ("skills", "instructions", "preferences"):
        flagged = instructions.generate(name, instructions.pools(docs, holdout), documents, seed, holdout)
    else:
        raise ValueError(f"unknown curated set {name!r}; expected one of {list(SETS)}")
    return flagged[:documents]


def write_curated(name: str, documents: int, seed: int, path: Path, stories: Stories | None = None,
                  holdout: float = HOLDOUT) -> Path:
    """Write the set as JSONL for a data source named after it with `holdout`; atomically, and
    reused if already written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        return path
    rows = aligned(records(name, documents, seed, holdout, stories), name, holdout)
    return write_jsonl(path, rows)

