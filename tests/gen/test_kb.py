"""The synthetic knowledge base (forge/gen/kb.py): deterministic from its seed, at least 200 facts,
look-alike distractors, tier-and-region prices stated in the documents, held-out questions (and
their templates' frames) that never occur in any training text, and the document-only facts'
sentences cut before their values."""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction

import pytest
import yaml

from forge.gen import kb
from forge.gen.generate import write_generated
from forge_testing import REPO


def _quickstart_sizes() -> dict[str, int]:
    """documents: of each kb_* source in recipes/quickstart.yaml (what the quickstart trains on)."""
    raw = yaml.safe_load((REPO / "recipes" / "quickstart.yaml").read_text())
    gens = [src["generate"] for src in raw["data"].values() if "generate" in src]
    return {g["kind"]: g["documents"] for g in gens if g["kind"].startswith("kb_")}


SIZES = _quickstart_sizes()


@pytest.fixture(scope="module")
def base():
    return kb.build(0)


@pytest.fixture(scope="module")
def training(base):
    """Every training text, lower-cased: the quickstart's documents and SFT turns (and more of
    them than it uses, so a longer run would not leak either)."""
    return [t.lower() for t in kb.training_texts(base, 2 * SIZES["kb_docs"], 2 * SIZES["kb_qa"])]


def test_the_quickstart_uses_the_documents_the_qa_records_and_the_eval_set():
    assert {"kb_docs", "kb_qa", "kb_eval"} <= set(SIZES) <= set(kb.KINDS)


def test_deterministic_from_the_seed(tmp_path):
    for kind in kb.KINDS:
        a = write_generated(kind, 300, 7, tmp_path / f"a-{kind}.jsonl").read_bytes()
        kb.build.cache_clear()
        b = write_generated(kind, 300, 7, tmp_path / f"b-{kind}.jsonl").read_bytes()
        c = write_generated(kind, 300, 8, tmp_path / f"c-{kind}.jsonl").read_bytes()
        assert a == b and a != c, kind
    assert kb.build(7).company != kb.build(8).company


def test_at_least_200_facts_each_with_one_value(base):
    assert len(base.facts) >= 200
    assert len({f.id for f in base.facts}) == len(base.facts)
    assert {f.attribute for f in base.facts} == set(kb.phrasings())
    assert all(f.value.strip() for f in base.facts)


def test_look_alike_products_differ_in_every_specification(base):
    assert len(base.look_alikes) >= 8
    values = {(f.entity, f.attribute): f.value for f in base.facts if f.attribute != "price_for"}
    for group in base.look_alikes:
        first = group[0]
        assert all(other.startswith(first) for other in group[1:])  # names that differ by a suffix
        for attr in ("price", "weight", "battery", "launched", "warranty"):
            assert len({values[(p, attr)] for p in group}) == len(group), (group, attr)
    codes = [dict(f.slots)["code"] for f in base.facts if f.attribute == "error"]
    swapped = {c[0] + c[1] + c[3] + c[2] for c in codes}
    assert len(set(codes) & swapped) == len(codes)  # every error code has a look-alike with two digits swapped


def test_prices_follow_tier_and_region_and_are_stated(base, training):
    price = {f.entity: int(f.value.split()[0]) for f in base.facts if f.attribute == "price"}
    discount = {dict(f.slots)["tier"]: int(f.value.split()[0]) for f in base.facts if f.attribute == "discount"}
    surcharge = {dict(f.slots)["region"]: int(f.value.split()[0]) for f in base.facts if f.attribute == "surcharge"}
    combos = [f for f in base.facts if f.attribute == "price_for"]
    assert len(combos) >= 40 and len({dict(f.slots)["tier"] for f in combos}) == 3
    for f in combos:
        s = dict(f.slots)
        exact = Fraction(price[f.entity] * (100 + surcharge.get(s["region"], 0)) * (100 - discount.get(s["tier"], 0)),
                         10_000)  # list price, plus the surcharge, less the discount
        assert int(f.value.split()[0]) == math.floor(exact / 10 + Fraction(1, 2)) * 10, (f, exact)  # nearest 10


def test_every_fact_is_stated_in_several_phrasings(base):
    docs = kb.documents(base, SIZES["kb_docs"])
    for f in base.facts:
        stated = {t for t in kb.phrasings()[f.attribute]["state"] if any(f.fill(t) in d for d in docs)}
        assert len(stated) >= 3, (f.id, stated)


def test_every_fact_is_asked_once_per_split(base):
    rows = kb.eval_records(base)
    for split in ("train", "heldout"):
        asked = [r["fact"] for r in rows if r["split"] == split]
        assert sorted(asked) == sorted(f.id for _, f in base.asked())
    for split in ("doconly", "stated"):
        asked = [r["fact"] for r in rows if r["split"] == split]
        assert sorted(asked) == sorted(f.id for f in base.facts if f.entity in base.doc_only), split
    qa = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in kb.qa_records(base, SIZES["kb_qa"])}
    for r in rows:  # the train split's questions are SFT questions, with the same answer
        if r["split"] == "train":
            assert qa[r["question"]] == r["answer"]


def test_document_only_products_are_in_the_documents_and_in_no_training_question(base, tmp_path):
    """A third or more of the products are document-only: stated in the documents, never named in
    an SFT record, a FAQ page or a QA transcript (the mixed-training text), whatever their size."""
    assert len(base.doc_only) * 3 >= len(base.products) and base.doc_only < set(base.products)
    docs = "\n".join(kb.documents(base, SIZES["kb_docs"]))
    assert all(p in docs for p in base.doc_only)
    trained = [json.loads(line) for kind in ("kb_qa", "kb_chat", "kb_faq")
               for line in write_generated(kind, 2 * SIZES["kb_qa"], 0, tmp_path / f"{kind}.jsonl").read_text().splitlines()]
    text = "\n".join(json.dumps(r) for r in trained)
    names = sorted(base.doc_only, key=len, reverse=True)
    assert not [p for p in names if p in text]
    asked = [r["question"] for r in kb.eval_records(base) if r["split"] == "doconly"]
    assert len(asked) >= 60 and all(any(p in q for p in names) for q in asked)


def test_document_only_facts_are_stated_as_their_documents_sentence_up_to_the_value(base):
    """Each document-only fact, right after its doconly question: a state template (the documents'
    own phrasings, an attribute's in turn) filled and cut just before the value."""
    rows, facts = kb.eval_records(base), {f.id: f for f in base.facts}
    stated = [(i, r) for i, r in enumerate(rows) if r["split"] == "stated"]
    for i, r in stated:
        f, (attr, split, t) = facts[r["fact"]], r["template"].split(".")
        assert (attr, split, r["attribute"], r["answer"]) == (f.attribute, "stated", f.attribute, f.value)
        assert rows[i - 1]["split"] == "doconly" and rows[i - 1]["fact"] == f.id
        assert f.value not in r["question"] and f.entity in r["question"] and r["question"] == r["question"].rstrip()
        assert f.fill(kb.phrasings()[attr]["state"][int(t)]).startswith(f"{r['question']} {f.value}"), r
    assert len({r["template"] for _, r in stated}) >= 15  # the templates taken in turn, not one per attribute


def test_a_sentence_start_names_the_fact_and_keeps_its_article():
    f = kb.Fact("error/E417", "error", (("code", "E417"),), "Overheated fan", "support-0")
    templates = ["No value in this one.", "{v} is the first word.", "Customers see {v} before {code}.",
                 "Code {code} signals a {v}."]
    assert kb._stated(f, templates, 0) == (3, "Code E417 signals an")  # "a" before the value reads "an"
    assert kb._stated(f, templates, 3) == (3, "Code E417 signals an")
    with pytest.raises(ValueError, match="error.state"):
        kb._stated(f, templates[:3], 0)


def _frame(template: str) -> str:
    """A template's longest stretch without slots: the part of its wording it does not share with
    its subject (`Which plant assembles the`)."""
    return max(re.split(r"\{\w+\}", template), key=len).strip(" .?,")


def test_held_out_questions_and_frames_never_occur_in_training_text(base, training):
    joined = "\n".join(training)
    for attr, p in kb.phrasings().items():
        assert not set(p["heldout"]) & (set(p["ask"]) | set(p["state"]))
        for t in p["heldout"]:
            frame = _frame(t)
            assert len(frame.split()) >= 3, (attr, t)
            assert frame.lower() not in joined, (attr, t, frame)
    heldout = [r["question"].lower() for r in kb.eval_records(base) if r["split"] == "heldout"]
    assert len(set(heldout)) == len(heldout)
    questions = {t for t in training}
    for q in heldout:
        assert q not in questions and q not in joined, q


def _stems(text: str) -> set[str]:
    words = re.findall(r"[a-z]+", re.sub(r"\{\w+\}", " ", text.lower()))
    return {w[:5] for w in words if len(w) >= 3 and w not in {"the", "what", "how", "does", "for", "and", "are"}}


def test_held_out_questions_name_the_attribute_with_a_word_the_documents_use():
    """A held-out question asks with a word (a synonym) that the documents' own phrasings of that
    attribute use: the documents teach it, the question's frame is new."""
    for attr, p in kb.phrasings().items():
        stated = set().union(*map(_stems, p["state"]))
        for t in p["heldout"]:
            assert _stems(t) & stated, (attr, t)


def test_written_records_have_the_fields_recipes_read(tmp_path):
    docs = [json.loads(x) for x in write_generated("kb_docs", 5, 0, tmp_path / "d.jsonl").read_text().splitlines()]
    qa = [json.loads(x) for x in write_generated("kb_qa", 5, 0, tmp_path / "q.jsonl").read_text().splitlines()]
    ev = [json.loads(x) for x in write_generated("kb_eval", 3, 0, tmp_path / "e.jsonl").read_text().splitlines()]
    assert len(docs) == 5 and all(set(d) == {"text"} for d in docs)
    assert len(qa) == 5 and [m["role"] for m in qa[0]["messages"]] == ["user", "assistant"]
    assert len(ev) == 6 and {r["split"] for r in ev} == {"train", "heldout"}
    assert {"question", "answer", "split", "fact"} <= set(ev[0])


def test_a_run_folders_cached_set_is_rewritten_when_the_generator_changes(tmp_path, monkeypatch):
    """The cached file's name holds the generator's fingerprint: a folder written by another forge
    (other phrasings, other splits) is never read as this one's."""
    first = write_generated("kb_eval", 50, 0, tmp_path / "kb_eval.jsonl")
    assert write_generated("kb_eval", 50, 0, tmp_path / "kb_eval.jsonl") == first  # reused
    monkeypatch.setattr(kb, "_generator_hash", lambda: "0ther000")
    second = write_generated("kb_eval", 50, 0, tmp_path / "kb_eval.jsonl")
    assert second != first and second.name == "kb_eval-0ther000.jsonl"
    assert second.read_text() == first.read_text()
