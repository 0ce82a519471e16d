"""Fill-in-the-blank questions from a text source's own sentences, as chat records for SFT.

A model that stores a document's facts can complete its sentences and still not answer a question
about them: reading "The Zimeth P5 weighs 6600 grams" teaches a continuation, not an answer. For
facts nobody wrote questions for (a customer's manuals, catalogues, tickets), each sentence of
each training document becomes one question per value it states: "Fill in the blank: The Zimeth P5
weighs ___." with "6600 grams" as the answer. Trained in SFT beside the questions the customer has
(for other entities), the model learns to answer from what the documents stored (what it adds on
the quickstart's document-only products: recipes/quickstart.yaml).

A value is a number with the unit word after it, or a name: a run of capitalised or digit-bearing
words (not a sentence's opening word alone, nor an opening "The", "For", ...). No model is asked
and nothing is invented: every answer is a span of its own sentence. Held-out documents give no
questions, so nothing of the source's evaluation split is trained on.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path

from forge.data.augment import sentences
from forge.data.formats import FormatSpec
from forge.data.mixing import in_holdout
from forge.data.sources import Source
from forge.errors import ForgeError
from forge.files import write_jsonl

PROMPT = "Fill in the blank: "
BLANK = "___"
_WORD = re.compile(r"\S+")
_EDGE = ".,;:!?()[]\"'“”‘’"
_NUMBER = re.compile(r"\d[\d.,]*%?")
_UNIT = re.compile(r"[a-z]+")
# lower-case words that open a sentence with a capital without being a name, nor follow a number as its unit
_COMMON = frozenset("""a an the this that these those it its our your their his her for from in on at by of to
with since if when while after before during each every all any some no not and or but as per is are was were be
has have had new one""".split())


def _bare(word: str) -> str:
    return word.strip(_EDGE)


def _named(word: str) -> bool:
    w = _bare(word)
    return bool(w) and (w[0].isupper() or any(c.isdigit() for c in w))


def spans(sentence: str) -> list[tuple[int, int]]:
    """(start, end) of each value `sentence` states, in order, none overlapping."""
    words = [(m.start(), m.group()) for m in _WORD.finditer(sentence)]
    out: list[tuple[int, int]] = []

    def span(first: int, last: int) -> tuple[int, int]:  # words first..last, edge punctuation off
        (a, wa), (b, wb) = words[first], words[last]
        a += len(wa) - len(wa.lstrip(_EDGE))
        return a, b + len(wb.rstrip(_EDGE))

    i = 0
    while i < len(words):
        w = _bare(words[i][1])
        if _NUMBER.fullmatch(w):
            unit = i + 1 < len(words) and words[i][1] == w and bool(_UNIT.fullmatch(words[i + 1][1].rstrip(_EDGE))) \
                and words[i + 1][1].rstrip(_EDGE) not in _COMMON  # "2015, the" has none: the comma ends it
            out.append(span(i, i + unit))
            i += 1 + unit
            continue
        if _named(words[i][1]):
            j = i
            while j + 1 < len(words) and _named(words[j + 1][1]) and words[j][1] == words[j][1].rstrip(_EDGE) \
                    and not words[j + 1][1].startswith(tuple(_EDGE)) and not _NUMBER.fullmatch(_bare(words[j + 1][1])):
                j += 1  # a name ends at punctuation, before a bracket and before a number (which keeps its unit)
            first = i
            while first == 0 and first < j and _bare(words[first][1]).lower() in _COMMON:
                first += 1  # "The Zimeth P5" opening a sentence: the name is "Zimeth P5"
            opening_word = first == 0 and first == j and not any(c.isdigit() for c in w)
            if not opening_word and _bare(words[first][1]).lower() not in _COMMON:
                out.append(span(first, j))
            i = j + 1
            continue
        i += 1
    return out


def questions(text: str) -> list[tuple[str, str]]:
    """(question, answer) for every value of every sentence of `text`."""
    out = []
    for sentence in sentences(text):
        for a, b in spans(sentence):
            out.append((PROMPT + sentence[:a] + BLANK + sentence[b:], sentence[a:b]))
    return out


def cloze_source(name: str, origin: Source, fingerprint: str, out_dir: Path, holdout: float,
                 proprietary: bool) -> Source:
    """A chat source `name` of the fill-in-the-blank questions of `origin`'s training documents
    (each question once, in the documents' order), written once as JSONL under `out_dir`, keyed by
    `origin`'s fingerprint."""
    rules = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # other rules write other questions
    key = hashlib.sha256(f"cloze:{rules}:{fingerprint}:{origin.holdout_key}:{origin.holdout}".encode()).hexdigest()[:16]
    path = out_dir / f"cloze-{name}-{key}.jsonl"
    if not path.is_file():
        seen: set[str] = set()
        rows = []
        for n, text in origin.records():
            if in_holdout(origin.holdout_key, n, origin.holdout):
                continue
            for q, a in questions(text):
                if q not in seen:
                    seen.add(q)
                    rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        if not rows:
            raise ForgeError(f"data.{name}.cloze: the training documents of data.{origin.name} state no number or "
                             "name to ask for (forge.data.cloze.spans)")
        write_jsonl(path, rows)
    return replace(origin, name=name, skipped={}, on_error="fail", files=(path,), format="jsonl",
                   text_fields=("text",), split="paragraph", hub=None, saved_dataset=None, max_records=None,
                   max_tokens=None, split_key=None,
                   holdout=holdout, proprietary=proprietary, chat=FormatSpec("messages"))
