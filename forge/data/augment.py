"""More renderings of a text source's documents, so that facts stated once can be recalled by a
question later (Allen-Zhu and Li, "Physics of Language Models: Part 3.1", arXiv:2309.14316: a
model that read each biography in one form recalled 9.7% of the facts of people it was never asked
about; with several renderings, sentences permuted, 86.6-96.6%).

Each training document is written `renderings` times, the copies after the first with their
sentences in another order (deterministic from the seed and the document's record number).
Held-out documents are written once and put at exactly the record numbers the source's stable
split holds out, so no copy of a held-out document is ever trained on. It runs on hygiene's output:
deduplication sees the documents, never their copies.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import replace
from pathlib import Path

from forge.data.mixing import aligned, in_holdout
from forge.data.sources import Source
from forge.errors import ForgeError
from forge.files import write_jsonl

# a sentence ends at . ! or ? followed by white space and a capital letter or a digit
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def renderings(text: str, count: int, rng: random.Random) -> list[str]:
    """`count` renderings of a document: itself, then its sentences in other orders (a document
    of one sentence, or one whose permutations run out, repeats an earlier rendering)."""
    parts, out = sentences(text), [text]
    seen = {tuple(parts)}
    for _ in range(count - 1):
        order = parts[:]
        for _ in range(8):  # a few tries for an order not written yet
            rng.shuffle(order)
            if tuple(order) not in seen:
                break
        seen.add(tuple(order))
        out.append(" ".join(order))
    return out


def augment_source(src: Source, count: int, seed: int, fingerprint: str, out_dir: Path,
                   extra: Path | None = None) -> Source:
    """`src` with each training document in `count` renderings, round by round (every document's
    first, then every document's second...), then the training texts of `extra` (a JSONL of
    {"text"} rows: model-written ones, forge.data.rewrite), held-out documents once at their
    split's numbers; written once as JSONL under `out_dir`, keyed by the source's fingerprint, the
    settings and `extra`'s name (which holds its own key)."""
    added = extra.name if extra is not None else ""
    key = hashlib.sha256(f"{fingerprint}:{count}:{seed}:{src.holdout_key}:{src.holdout}:{added}".encode()).hexdigest()[:16]
    path = out_dir / f"augment-{src.name}-{key}.jsonl"
    if not path.is_file():
        train: list[list[str]] = []
        held: list[str] = []
        for n, text in src.records():
            if in_holdout(src.holdout_key, n, src.holdout):
                held.append(text)
            else:
                train.append(renderings(text, count, random.Random(f"augment:{seed}:{n}")))
        if src.holdout > 0 and not held and train:
            raise ForgeError(f"data.{src.name}.augment: none of its {len(train)} documents is held out (holdout "
                             f"{src.holdout}), so the copies could not be kept out of its evaluation split; give "
                             "more documents or holdout: 0")
        flagged = [({"text": doc[r]}, False) for r in range(count) for doc in train]
        if extra is not None:
            with open(extra, encoding="utf-8") as f:
                flagged += [({"text": json.loads(line)["text"]}, False) for line in f if line.strip()]
        rows = aligned(flagged + [({"text": t}, True) for t in held], src.holdout_key, src.holdout)
        write_jsonl(path, rows)
    return replace(src, files=(path,), format="jsonl", text_fields=("text",), split="paragraph", hub=None,
                   saved_dataset=None, max_records=None, max_tokens=None, split_key=src.holdout_key)
