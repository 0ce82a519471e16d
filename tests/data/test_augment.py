"""Document augmentation (forge/data/augment.py): each training document in several renderings with
its sentences permuted, deterministic from the seed; held-out documents never copied into training."""
from __future__ import annotations

import json
import random

import pytest

from forge.data.augment import augment_source, renderings, sentences
from forge.data.mixing import in_holdout
from forge.data.sources import Source


def _docs(n: int) -> list[str]:
    return [f"Doc {i} is blue. It weighs {i} grams. It was made in {2000 + i}. Ask for part {i}A." for i in range(n)]


def _source(tmp_path, n: int = 200, holdout: float = 0.1) -> Source:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(n)))
    return Source("manual", (path,), "jsonl", ("text",), "paragraph", True, holdout=holdout)


def test_renderings_permute_sentences_deterministically():
    text = _docs(3)[2]
    a, b = renderings(text, 4, random.Random(7)), renderings(text, 4, random.Random(7))
    assert a == b and a[0] == text and len(set(a)) == 4
    assert all(sorted(sentences(r)) == sorted(sentences(text)) for r in a)
    assert renderings(text, 4, random.Random(8)) != a


def test_training_documents_are_copied_and_held_out_ones_never(tmp_path):
    src = _source(tmp_path)
    out = augment_source(src, 3, 0, "fp", tmp_path / "aug")
    rows = [json.loads(line)["text"] for line in out.files[0].read_text().splitlines()]
    train = [t for n, t in enumerate(rows, start=1) if not in_holdout(src.holdout_key, n, src.holdout)]
    held = {t for n, t in enumerate(rows, start=1) if in_holdout(src.holdout_key, n, src.holdout)}
    originals = {n: t for n, t in src.records()}
    held_docs = {t for n, t in originals.items() if in_holdout("manual", n, 0.1)}
    assert held == held_docs and held  # the eval split reads the same documents as without augmentation
    by_doc: dict[str, int] = {}
    for t in train:
        key = " ".join(sorted(sentences(t)))
        by_doc[key] = by_doc.get(key, 0) + 1
    assert len(by_doc) == len(originals) - len(held_docs) and set(by_doc.values()) == {3}
    held_keys = {" ".join(sorted(sentences(t))) for t in held_docs}
    assert not held_keys & set(by_doc)  # no rendering of a held-out document is trained on
    again = augment_source(src, 3, 0, "fp", tmp_path / "aug2")
    assert again.files[0].read_bytes() == out.files[0].read_bytes()


def test_augment_refuses_chat_sources_and_bad_counts(tmp_path):
    from forge.recipe import DataSource

    with pytest.raises(ValueError, match="augment: renders plain-text documents"):
        DataSource(path=str(tmp_path), chat={"kind": "messages"}, augment={"renderings": 2})
    with pytest.raises(ValueError, match="renderings"):
        DataSource(path=str(tmp_path), augment={"renderings": 0})


def test_a_source_with_nothing_held_out_is_refused(tmp_path):
    from forge.errors import ForgeError

    src = _source(tmp_path, n=3, holdout=0.01)
    with pytest.raises(ForgeError, match=r"data\.manual\.augment: none of its 3 documents is held out"):
        augment_source(src, 2, 0, "fp", tmp_path / "aug")
