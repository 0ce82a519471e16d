"""Fill-in-the-blank questions from a source's documents (forge/data/cloze.py): the values a sentence
states and only those, every answer a span of its own sentence, nothing from a held-out document,
no held-out question of the quickstart's evaluation set among them, and the recipe's `cloze:`
naming a source of documents, or an error that says which."""
from __future__ import annotations

import json

import pytest

from forge.data.cloze import BLANK, PROMPT, cloze_source, questions, spans
from forge.data.mixing import in_holdout
from forge.data.sources import Source
from forge.errors import ForgeError
from forge.gen import kb
from forge.inputs import resolve_source
from forge.recipe import DataSource, load_recipe


def values(sentence: str) -> list[str]:
    return [sentence[a:b] for a, b in spans(sentence)]


@pytest.mark.parametrize("sentence, want", [
    ("The Zimeth P5 weighs 6600 grams.", ["Zimeth P5", "6600 grams"]),
    ("Since 2017, the Zimeth P5 Pro has been on the market.", ["2017", "Zimeth P5 Pro"]),
    ("For Enterprise customers in the Drukrax region, the Zimeth P5 costs 2160 euros.",
     ["Enterprise", "Drukrax", "Zimeth P5", "2160 euros"]),
    ("If the display shows E681, the cause is a weak air compressor.", ["E681"]),
    ("Returns are accepted for 30 days (Plus tier).", ["30 days", "Plus"]),
    ("Customers love it.", []),  # an opening capital alone is no name
    ("It ships in 3 to 5 days.", ["3", "5 days"]),  # "to" is no unit
    ("The Model X-200 (2019) has a 3.5 inch screen.", ["Model X-200", "2019", "3.5 inch"]),  # names end at a bracket
])
def test_spans_are_the_numbers_with_their_unit_and_the_names(sentence, want):
    assert values(sentence) == want


def test_each_question_blanks_one_value_of_its_sentence():
    text = "The Zimeth P5 weighs 6600 grams. It runs for 17 hours on a single charge."
    got = questions(text)
    assert got == [(f"{PROMPT}The {BLANK} weighs 6600 grams.", "Zimeth P5"),
                   (f"{PROMPT}The Zimeth P5 weighs {BLANK}.", "6600 grams"),
                   (f"{PROMPT}It runs for {BLANK} on a single charge.", "17 hours")]
    for q, a in got:  # the answer put back gives the sentence: nothing is invented
        assert q.removeprefix(PROMPT).replace(BLANK, a) in text


def test_every_answer_of_the_quickstart_documents_is_in_its_page():
    base = kb.build(0)
    for page in kb.documents(base, 62):
        for q, a in questions(page):
            assert q.count(BLANK) == 1 and q.removeprefix(PROMPT).replace(BLANK, a) in page
    answered = {a for page in kb.documents(base, 62) for _, a in questions(page)}
    products = {f.value for f in base.facts if f.entity in base.products}
    assert products <= answered  # every product's every value is asked for (an error code's meaning, a
    # lower-case phrase, is not a value here: its code is)


def test_no_held_out_question_of_the_quickstart_is_among_them():
    base = kb.build(0)
    asked = {q.lower() for page in kb.documents(base, 600) for q, _ in questions(page)}
    joined = "\n".join(asked)
    for r in kb.eval_records(base):
        if r["split"] in ("heldout", "doconly"):
            assert r["question"].lower() not in joined


def _source(tmp_path, texts: list[str], holdout: float) -> Source:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return resolve_source("docs", DataSource(path=str(path), holdout=holdout), tmp_path)


def test_the_source_skips_held_out_documents_and_repeats_no_question(tmp_path):
    texts = [f"The Model {i} weighs {100 + i} grams. Support answers within 4 hours." for i in range(80)]
    src = _source(tmp_path, texts, holdout=0.25)
    out = cloze_source("blanks", src, src.fingerprint(), tmp_path / "out", 0.0, True)
    rows = [json.loads(line) for line in out.files[0].read_text().splitlines()]
    asked = [r["messages"][0]["content"] for r in rows]
    held = [t for n, t in enumerate(texts, start=1) if in_holdout(src.holdout_key, n, src.holdout)]  # records count from 1
    assert 0 < len(held) < len(texts)
    for text in texts:
        mine = {q for q, _ in questions(text)} - {f"{PROMPT}Support answers within {BLANK}."}
        assert (mine & set(asked)) == (set() if text in held else mine)
    assert len(asked) == len(set(asked)) and asked.count(f"{PROMPT}Support answers within {BLANK}.") == 1
    assert out.chat.kind == "messages" and out.proprietary and out.holdout == 0.0
    again = cloze_source("blanks", src, src.fingerprint(), tmp_path / "out", 0.0, True)
    assert again.files == out.files  # written once, then reused


def test_a_recipe_names_a_source_of_documents(tmp_path):
    recipe = tmp_path / "r.yaml"
    body = """name: r
base: {scratch: {hidden_size: 32, layers: 1, heads: 2, vocab_size: 300, tokenizer_sources: [docs]}}
data:
  docs: {path: docs.txt}
  chats: {path: chats.jsonl, chat: {kind: messages}}
  blanks: {cloze: %s}
stages:
  - {name: sft, kind: sft, data: [blanks], max_steps: 1}
output: out
"""
    (tmp_path / "docs.txt").write_text("The Model 1 weighs 100 grams.\n")
    (tmp_path / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    recipe.write_text(body % "docs")
    assert load_recipe(recipe).data["blanks"].chat.kind == "messages"
    for bad, said in (("chats", "chat records, not documents"), ("nothing", "an unknown source")):
        recipe.write_text(body % bad)
        with pytest.raises(ForgeError, match=rf"data\.blanks\.cloze: '{bad}' is {said}.*\['docs'\]"):
            load_recipe(recipe)
    with pytest.raises(ForgeError, match=r"data\.blanks: its questions are made from data\.docs"):
        resolve_source("blanks", DataSource(cloze="docs"), tmp_path)
    recipe.write_text(body.replace("blanks: {cloze: %s}", "blanks: {cloze: docs, max_records: 5, hygiene: true}"))
    with pytest.raises(ForgeError, match=r"data\.blanks.*\['hygiene', 'max_records'\] would not apply; give them on data\.docs"):
        load_recipe(recipe)
    recipe.write_text((body % "docs") + "hygiene: {decontaminate_against: [blanks]}\n")
    with pytest.raises(ForgeError, match=r"decontaminate_against\[0\]: data\.blanks is made after hygiene"):
        load_recipe(recipe)


def test_a_source_of_documents_without_values_is_named(tmp_path):
    src = _source(tmp_path, ["nothing here to ask.", "still nothing."], holdout=0.0)
    with pytest.raises(ForgeError, match=r"data\.blanks\.cloze: the training documents of data\.docs state no number"):
        cloze_source("blanks", src, src.fingerprint(), tmp_path / "out", 0.0, False)
    assert not list((tmp_path / "out").glob("*"))  # nothing half-written
