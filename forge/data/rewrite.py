"""Model-written augmentation, the parts without a model: the prompts that ask a chat model for
paraphrases of a document and question-answer pairs about it, the parsing of its answers, and the
grounding check that decides what is kept (EntiGraph-style synthetic continued pretraining: Yang et
al. 2024, arXiv:2409.07431; why several forms of a fact help: Allen-Zhu and Li, arXiv:2309.14316).

A question-answer pair is kept only if its answer, normalised (case, white space, punctuation at
the ends), is found in the document at word boundaries and is not trivially short; a paraphrase only
if every number and every capitalised name in it occurs in the document, so the generator cannot
introduce facts. `write_rewrites` asks for every training document of a source (held-out documents
never), cleans what is kept with the caller's hygiene and writes it once as JSONL, keyed by the
source's fingerprint, the settings and the generator's identity: a rerun does not ask again.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from forge.data.mixing import in_holdout
from forge.data.sources import Source
from forge.files import write_jsonl

# how a paraphrase is asked to be written: the seed picks one per paraphrase (decoding is greedy,
# so the styles are what makes a document's paraphrases differ)
STYLES = ("in plain words, as if explaining it to a new customer",
          "as a short encyclopedia entry",
          "as an entry of a product catalogue",
          "as the answer of a support agent",
          "in a different order, one fact per sentence",
          "as concise notes in full sentences")

PARAPHRASE = ("Here is a passage.\n\nPassage:\n{passage}\n\nRewrite the passage {style}. Keep every fact, name "
              "and number exactly as written and add nothing that is not in it. Reply with the rewritten passage only.")
QUESTIONS = ("Here is a passage.\n\nPassage:\n{passage}\n\nWrite {count} questions that the passage answers, each "
             "followed by its answer copied word for word from the passage, in this form:\nQuestion: ...\nAnswer: ...")

_TRIVIAL = frozenset("""a an the it its this that these those yes no not none and or of to in on at is are was were
be it's he she they we you i""".split())
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_CAPITAL = re.compile(r"\b[A-Z][\w'’-]*")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s+|\n\s*|[\"'(]\s*)$")
_QA = re.compile(r"^\s*(?:\d+[.)]\s*|[-*]\s*)?(q|question|a|answer)\s*\d*\s*[:.)-]\s*(.*)$", re.I)
_LABEL = re.compile(r"^\s*(?:rewritten passage|paraphrase|passage|rewrite)\s*:\s*", re.I)


def normalise(text: str) -> str:
    """Lower case, white space collapsed, punctuation and quotes stripped at both ends."""
    return re.sub(r"\s+", " ", text).strip().strip(".,;:!?\"'`()[]{}“”‘’*").strip().lower()


def found_in(answer: str, passage: str) -> bool:
    """Whether `answer`, normalised, occurs in `passage`, normalised, at word boundaries."""
    a = normalise(answer)
    return bool(a) and re.search(rf"(?<!\w){re.escape(a)}(?!\w)", re.sub(r"\s+", " ", passage).lower()) is not None


def trivial(answer: str) -> bool:
    """An answer too short to carry a fact: under 2 letters or digits, or only a filler word."""
    a = normalise(answer)
    return sum(c.isalnum() for c in a) < 2 or a in _TRIVIAL


def grounded_answer(question: str, answer: str, passage: str) -> bool:
    return bool(normalise(question)) and not trivial(answer) and found_in(answer, passage)


def invented(paraphrase: str, passage: str) -> list[str]:
    """The numbers and capitalised names of `paraphrase` that `passage` does not contain. A word
    capitalised where a sentence opens counts as a name only if it looks like one (a digit or a
    capital inside it) or the paraphrase also writes it capitalised mid-sentence: a verb or a noun
    opening a sentence is not a fact."""
    numbers = set(_NUMBER.findall(passage))
    out = [n for n in _NUMBER.findall(paraphrase) if n not in numbers]
    words = set(re.findall(r"[\w'’-]+", passage.lower()))
    found = [(m.group(0).rstrip("'’-"), _SENTENCE_START.search(paraphrase[:m.start()]) is not None)
             for m in _CAPITAL.finditer(paraphrase)]
    inside = {w for w, opener in found if not opener}
    for word, opener in found:
        if word.lower() in words or word in out:
            continue
        if opener and word not in inside and not re.search(r"\d|.[A-Z]", word):
            continue
        out.append(word)
    return out


_CONTENT = re.compile(r"[a-z][a-z'’-]{3,}")  # words of four letters or more: what a text is about


def on_topic(paraphrase: str, passage: str) -> bool:
    """The paraphrase states something of the passage: one of its numbers or names at least, and
    at least 40% of its content words are the passage's (a fluent text about something else, or a
    small model's babble, carries no fact of the document however little it invents)."""
    def named(text: str) -> set[str]:  # numbers and capitalised words, not "The" or "It" opening a sentence
        return set(_NUMBER.findall(text)) | {w.lower() for w in _CAPITAL.findall(text)} - _TRIVIAL

    facts, said = named(passage), named(paraphrase)
    words = set(_CONTENT.findall(paraphrase.lower()))
    known = set(_CONTENT.findall(passage.lower()))
    return bool(facts & said) and bool(words) and len(words & known) >= 0.4 * len(words)


def grounded_paraphrase(paraphrase: str, passage: str) -> bool:
    """A paraphrase worth keeping: some words, not the passage itself, on its topic, nothing invented."""
    p = normalise(paraphrase)
    return (len(p.split()) >= 3 and p != normalise(passage) and on_topic(paraphrase, passage)
            and not invented(paraphrase, passage))


def parse_paraphrase(answer: str) -> str:
    """The model's paraphrase: its answer without a leading label ("Paraphrase:") or quotes."""
    return _LABEL.sub("", answer.strip()).strip().strip('"“”').strip()


def parse_pairs(answer: str) -> list[tuple[str, str]]:
    """(question, answer) pairs from "Question: ... / Answer: ..." lines (also Q:/A:, numbered); a
    line that continues a question or answer is joined to it; a question without answer is dropped."""
    pairs: list[tuple[str, str]] = []
    q: list[str] | None = None
    a: list[str] | None = None
    for line in answer.splitlines():
        m = _QA.match(line)
        if m and m.group(1).lower().startswith("q"):
            if q is not None and a is not None:
                pairs.append((" ".join(q), " ".join(a)))
            q, a = [m.group(2).strip()], None
        elif m and q is not None and a is None:
            a = [m.group(2).strip()]
        elif line.strip() and q is not None:
            (q if a is None else a).append(line.strip())
    if q is not None and a is not None:
        pairs.append((" ".join(q), " ".join(a)))
    return [(x.strip(), y.strip()) for x, y in pairs]


def qa_text(question: str, answer: str) -> str:
    return f"Question: {question}\nAnswer: {answer}"


def prompts_for(passage: str, number: int, paraphrases: int, questions: int, seed: int) -> list[tuple[str, str]]:
    """The (kind, prompt) asks for one document: its paraphrases (styles drawn from the seed and the
    document's record number), then one ask for all its question-answer pairs."""
    rng = random.Random(f"rewrite:{seed}:{number}")
    styles = rng.sample(STYLES, min(paraphrases, len(STYLES))) + [rng.choice(STYLES)
                                                                 for _ in range(paraphrases - len(STYLES))]
    asks = [("paraphrase", PARAPHRASE.format(passage=passage, style=s)) for s in styles]
    if questions:
        asks.append(("qa", QUESTIONS.format(passage=passage, count=questions)))
    return asks


@dataclass
class RewriteCounts:
    """What was asked and kept: pairs and paraphrases kept and dropped (a pair asked for and never
    written counts as dropped), and generated texts hygiene removed."""

    documents: int = 0
    paraphrases_kept: int = 0
    paraphrases_dropped: int = 0
    qa_kept: int = 0
    qa_dropped: int = 0
    removed_by_hygiene: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def judge_answers(passage: str, kind: str, answer: str, questions: int, counts: RewriteCounts) -> list[str]:
    """The texts kept from one answer of the generator, counting what is kept and dropped."""
    if kind == "paraphrase":
        text = parse_paraphrase(answer)
        if grounded_paraphrase(text, passage):
            counts.paraphrases_kept += 1
            return [text]
        counts.paraphrases_dropped += 1
        return []
    kept = [qa_text(q, a) for q, a in parse_pairs(answer)[:questions] if grounded_answer(q, a, passage)]
    counts.qa_kept += len(kept)
    counts.qa_dropped += questions - len(kept)
    return kept


Ask = Callable[[list[str]], list[str]]       # prompts -> the generator's answers, in order
Clean = Callable[[Iterable[tuple[int, str]]], Iterable[tuple[int, str]]]  # hygiene on (number, text)


def rewrite_key(fingerprint: str, settings: dict, generator: str, src: Source) -> str:
    head = json.dumps({"source": fingerprint, "settings": settings, "generator": generator,
                       "holdout": [src.holdout_key, src.holdout]}, sort_keys=True)
    return hashlib.sha256(head.encode()).hexdigest()[:16]


def write_rewrites(src: Source, ask: Callable[[], Ask], settings: dict, generator: str, fingerprint: str,
                   clean: Clean, out_dir: Path) -> tuple[Path, RewriteCounts]:
    """The JSONL of kept generated texts for `src`'s training documents and its counts; `settings`
    holds paraphrases, questions and seed (and whatever else changes the output); `ask()` opens the
    generator, called only when the file is not there yet."""
    path = out_dir / f"rewrite-{src.name}-{rewrite_key(fingerprint, settings, generator, src)}.jsonl"
    counts_path = path.with_suffix(".counts.json")
    if path.is_file() and counts_path.is_file():
        return path, RewriteCounts(**json.loads(counts_path.read_text()))
    n_para, n_qa, seed = int(settings["paraphrases"]), int(settings["questions"]), int(settings["seed"])
    docs = [(n, t) for n, t in src.records() if not in_holdout(src.holdout_key, n, src.holdout)]
    asks = [(n, kind, prompt) for n, t in docs for kind, prompt in prompts_for(t, n, n_para, n_qa, seed)]
    answers = ask()([p for _, _, p in asks]) if asks else []
    passages = dict(docs)
    counts, kept = RewriteCounts(documents=len(docs)), []
    for (n, kind, _), answer in zip(asks, answers, strict=True):
        kept += [(n, text) for text in judge_answers(passages[n], kind, answer, n_qa, counts)]
    cleaned = list(clean(kept))
    counts.removed_by_hygiene = len(kept) - len(cleaned)
    counts_path.parent.mkdir(parents=True, exist_ok=True)
    counts_path.write_text(json.dumps(counts.as_dict(), indent=1))  # before the file whose presence says done
    write_jsonl(path, ({"text": text, "document": n} for n, text in cleaned))
    return path, counts
