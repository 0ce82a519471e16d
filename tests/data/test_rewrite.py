"""Model-written augmentation without a model (forge/data/rewrite.py): the parsing of a generator's
answers, the grounding check (an answer not in its passage is dropped, a paraphrase with an invented
number or name is dropped), held-out documents never asked about, and determinism from the seed."""
from __future__ import annotations

import json

import pytest

from forge.data.mixing import in_holdout
from forge.data.rewrite import (
    found_in,
    grounded_answer,
    grounded_paraphrase,
    invented,
    parse_pairs,
    parse_paraphrase,
    prompts_for,
    write_rewrites,
)
from forge.data.sources import Source

PASSAGE = ("The Zorblax X2 kettle holds 1.7 litres and boils water in 180 seconds. It is made in Tallinn by "
           "Nordvik Appliances. Its warranty lasts 3 years.")


def test_qa_answers_are_kept_only_when_found_in_the_passage():
    assert grounded_answer("How much does it hold?", "1.7 litres.", PASSAGE)
    assert grounded_answer("Who makes it?", "  nordvik   APPLIANCES ", PASSAGE)  # case, spaces, end punctuation
    assert not grounded_answer("How much does it hold?", "2 litres", PASSAGE)  # not in the passage
    assert not grounded_answer("Where is it made?", "Tallin", PASSAGE)  # inside a word is not found
    assert not grounded_answer("Is it made?", "It", PASSAGE) and not grounded_answer("?", "x", PASSAGE)  # trivial
    assert not grounded_answer("", "Tallinn", PASSAGE)  # no question
    assert not found_in("8", "boils in 180 seconds")


def test_paraphrases_with_invented_numbers_or_names_are_dropped():
    good = "Nordvik Appliances makes the Zorblax X2 in Tallinn. Customers get a 3 years warranty; it holds 1.7 litres."
    assert grounded_paraphrase(good, PASSAGE) and invented(good, PASSAGE) == []
    assert invented(good.replace("1.7", "2.5"), PASSAGE) == ["2.5"]
    assert not grounded_paraphrase(good.replace("1.7", "2.5"), PASSAGE)
    assert invented(good.replace("Tallinn", "Riga"), PASSAGE) == ["Riga"]
    assert invented("Riga is near. Nordvik works in Riga.", PASSAGE) == ["Riga"]  # also where a sentence opens
    assert invented("Write to Nordvik. Buying is easy.", PASSAGE) == []  # words opening a sentence are not names
    assert invented("ZX is the maker.", PASSAGE) == ["ZX"]  # unless they look like one
    assert not grounded_paraphrase(PASSAGE, PASSAGE)  # the passage itself adds nothing
    assert not grounded_paraphrase("Kettle.", PASSAGE)
    # invents nothing, yet states nothing of the passage: a small model's babble, or another topic
    assert not grounded_paraphrase("the first operand after median of the operandude of the operand", PASSAGE)
    assert not grounded_paraphrase("It is a lovely morning and everyone walks to the river together.", PASSAGE)


def test_answers_are_parsed_in_the_forms_models_write():
    text = ("Here are the questions.\n1. Question: How much does the kettle hold?\nAnswer: 1.7 litres\n\n"
            "Q2: Who makes it?\nA2: Nordvik Appliances, in\nTallinn\nQuestion: A question left unanswered?")
    assert parse_pairs(text) == [("How much does the kettle hold?", "1.7 litres"),
                                 ("Who makes it?", "Nordvik Appliances, in Tallinn")]
    assert parse_paraphrase('Rewritten passage: "The kettle holds 1.7 litres."') == "The kettle holds 1.7 litres."


def _source(tmp_path, n=40, holdout=0.1) -> Source:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"Part {i}A of the Zorblax weighs {100 + i} grams. "
                                                f"It ships from Tallinn."}) + "\n" for i in range(n)))
    return Source("manual", (path,), "jsonl", ("text",), "paragraph", True, holdout=holdout)


def _fake(asked: list[str]):
    """A generator that answers each ask by a rule: a grounded paraphrase, one grounded and one
    invented QA pair."""
    def ask(prompts):
        asked.extend(prompts)
        out = []
        for p in prompts:
            passage = p.split("Passage:\n", 1)[1].split("\n\n", 1)[0]
            grams = passage.split(" weighs ")[1].split(" ")[0]
            if p.startswith("Here is a passage.\n\nPassage:") and "Rewrite the passage" in p:
                out.append(f"Paraphrase: From Tallinn ships the part, and it weighs {grams} grams.")
            else:
                out.append(f"Question: How heavy is it?\nAnswer: {grams} grams\nQuestion: Price?\nAnswer: 99 euros")
        return out
    return lambda: ask


def test_held_out_documents_are_never_asked_and_counts_add_up(tmp_path):
    src, asked = _source(tmp_path), []
    settings = {"paraphrases": 2, "questions": 2, "seed": 0}
    path, counts = write_rewrites(src, _fake(asked), settings, "fake", "fp", lambda r: r, tmp_path / "out")
    held = [t for n, t in src.records() if in_holdout(src.holdout_key, n, src.holdout)]
    assert held and not any(t in p for t in held for p in asked)
    train = counts.documents
    assert train == 40 - len(held) and len(asked) == 3 * train
    assert (counts.paraphrases_kept, counts.paraphrases_dropped) == (2 * train, 0)
    assert (counts.qa_kept, counts.qa_dropped) == (train, train)  # the invented price is dropped
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    passages = dict(src.records())
    for row in rows:
        if row["text"].startswith("Question:"):
            assert found_in(row["text"].split("\nAnswer: ")[1], passages[row["document"]])
    assert not any("euros" in r["text"] for r in rows)
    # cached: a second call does not ask again
    again, _ = write_rewrites(src, lambda: pytest.fail("asked again"), settings, "fake", "fp", lambda r: r,
                              tmp_path / "out")
    assert again == path


def test_the_same_seed_writes_the_same_file_and_another_seed_asks_other_styles(tmp_path):
    src = _source(tmp_path)
    files = []
    for seed, where in ((3, "a"), (3, "b"), (4, "c")):
        asked: list[str] = []
        path, _ = write_rewrites(src, _fake(asked), {"paraphrases": 2, "questions": 1, "seed": seed}, "fake", "fp",
                                 lambda r: r, tmp_path / where)
        files.append((path.read_bytes(), asked))
    assert files[0] == files[1]
    assert files[0][1] != files[2][1]  # the seed chooses the paraphrases' styles
    assert prompts_for(PASSAGE, 7, 3, 2, 0) == prompts_for(PASSAGE, 7, 3, 2, 0)
    kinds = [k for k, _ in prompts_for(PASSAGE, 7, 3, 2, 0)]
    assert kinds == ["paraphrase"] * 3 + ["qa"] and len({p for _, p in prompts_for(PASSAGE, 7, 3, 2, 0)}) == 4
