"""A synthetic proprietary knowledge base, deterministic from its seed: a fictional company's
products (look-alike names with different values), specifications, prices that depend on tier and
region, policies and support answers; written as paraphrase-augmented documents (continued
pretraining), question-answer chat records (SFT) and an evaluation set that asks every fact once in
a training phrasing and once in a held-out one (forge/gen/kb_phrasings.yaml holds the phrasings).
A third of the product lines are document-only: their facts are in the documents and in no question
this module writes for training, so the evaluation's `doconly` split asks what the model learned from
the documents alone (the pages themselves, and what forge derives from them, such as the quickstart's
fill-in-the-blank questions), and its `stated` split gives the documents' own sentences up to the
value, to complete: whether the model stored a fact, apart from whether a question gets it out.

Recipes read it through `generate: {kind: kb_docs | kb_faq | kb_chat | kb_qa | kb_eval, documents: N, seed: S}`.
"""
from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from forge.files import write_jsonl

KINDS = ("kb_docs", "kb_faq", "kb_chat", "kb_qa", "kb_eval")
# forge's default chat template (forge.data.chat_render) with the special tokens of forge's tokenizers:
# how kb_chat writes a QA record as text, as SFT renders it for a model without a template of its own
TRANSCRIPT = "<s><|user|>\n{q}</s><|assistant|>\n{a}</s>"
SLOT = re.compile(r"\{(\w+)\}")
AN = re.compile(r"\b([Aa]) (?=[AEIOU])")

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "pl", "sk"]
_VOWELS = ["a", "e", "i", "o", "u"]
_CODAS = ["", "n", "r", "l", "x", "th", "sk", "nd", "rv", "lt"]
_LETTERS = "BCDFGHKLMNPRSTVWXZ"
_PARTS = ["intake filter", "coolant line", "drive belt", "sensor cable", "motor winding", "firmware image",
          "battery cell", "feed roller", "door seal", "cooling fan", "optical lens", "rotor bearing",
          "water tank", "licence key", "air compressor", "relief valve", "settings file", "antenna lead",
          "power circuit", "carbon brush"]
_FAULTS = ["blocked", "leaking", "worn", "loose", "overheated", "corrupted", "weak", "jammed", "cracked",
           "stalled", "dirty", "misaligned", "empty", "expired", "failing", "stuck", "damaged", "disconnected",
           "overloaded", "frayed"]
TIERS = ("Standard", "Plus", "Enterprise")
DISCOUNTS = {"Plus": 10, "Enterprise": 25}           # percent off the list price
SURCHARGES = (10, 20, 30)                            # percent above list price, one per non-home region
DOC_ONLY = 3                                         # product lines known only from the documents (of 8)


@dataclass(frozen=True)
class Fact:
    """One thing the knowledge base states, with the exact value a question about it expects."""

    id: str
    attribute: str          # a key of kb_phrasings.yaml
    slots: tuple            # ((slot, text), ...) filling the templates, besides {v}
    value: str
    entity: str             # the document that states it (a product, the price list, support)

    def fill(self, template: str, value: bool = True) -> str:
        slots = dict(self.slots, **({"v": self.value} if value else {}))
        return AN.sub(r"\1n ", SLOT.sub(lambda m: slots[m.group(1)], template))  # "an Enterprise account"


@dataclass
class KnowledgeBase:
    seed: int
    company: str
    facts: list[Fact]
    intros: dict[str, str]               # entity -> its documents' first sentence (products have none)
    products: list[str] = field(default_factory=list)
    look_alikes: list[tuple[str, ...]] = field(default_factory=list)  # products whose names differ by a suffix
    doc_only: frozenset[str] = frozenset()  # entities never asked about in training (whole product lines)

    def asked(self) -> list[tuple[int, Fact]]:
        """(index, fact) of the facts training questions ask: all but the document-only ones."""
        return [(i, f) for i, f in enumerate(self.facts) if f.entity not in self.doc_only]


@lru_cache(maxsize=1)
def phrasings() -> dict[str, dict[str, list[str]]]:
    """attribute -> {state, ask, heldout} templates."""
    return yaml.safe_load((Path(__file__).parent / "kb_phrasings.yaml").read_text(encoding="utf-8"))


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables - 1)).capitalize() \
        + rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS[1:])


def _names(rng: random.Random, n: int, syllables: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, syllables)
        if w.lower() not in taken and all(w[:3] != o[:3] for o in out):  # invented, and unlike each other
            taken.add(w.lower())
            out.append(w)
    return out


@lru_cache(maxsize=4)
def build(seed: int = 0, families: int = 8) -> KnowledgeBase:
    """The knowledge base of `seed`: `families` product lines of three look-alikes each (24 products,
    6 specifications and 2 tier-and-region prices apiece), the tier and region rules, and support
    error codes (about 230 facts)."""
    rng = random.Random(f"forge-kb:{seed}")
    taken: set[str] = set()
    company = _names(rng, 1, 3, taken)[0] + " Instruments"
    fams, cities = _names(rng, families, 2, taken), _names(rng, 8, 2, taken)
    home, *regions = _names(rng, 1 + len(SURCHARGES), 2, taken)
    facts: list[Fact] = []
    intros = {}
    products, alikes = [], []

    def add(attribute: str, entity: str, value: str, **slots: str) -> None:
        key = "/".join([attribute, *slots.values()])
        facts.append(Fact(key, attribute, tuple(slots.items()), value, entity))

    for fam in fams:
        code = rng.choice(_LETTERS) + str(rng.randint(2, 9))
        names = [f"{fam} {code}", f"{fam} {code} Pro", f"{fam} {code}0"]
        alikes.append(tuple(names))
        prices = rng.sample(range(600, 4000, 100), 3)
        weights, years = rng.sample(range(400, 9000, 100), 3), rng.sample(range(2009, 2025), 3)
        hours, warranties = rng.sample(range(4, 40), 3), rng.sample(range(2, 9), 3)
        for i, p in enumerate(names):
            products.append(p)
            add("price", p, f"{prices[i]} euros", p=p)
            add("weight", p, f"{weights[i]} grams", p=p)
            add("warranty", p, f"{warranties[i]} years", p=p)
            add("battery", p, f"{hours[i]} hours", p=p)
            add("factory", p, rng.choice(cities), p=p)
            add("launched", p, str(years[i]), p=p)
            combos = rng.sample([(t, r) for t in TIERS for r in [home, *regions] if (t, r) != ("Standard", home)], 2)
            for tier, region in combos:
                surcharge = 0 if region == home else SURCHARGES[regions.index(region)]
                add("price_for", p, f"{tier_price(prices[i], surcharge, DISCOUNTS.get(tier, 0))} euros",
                    p=p, tier=tier, region=region)
    intros["pricing"] = (f"{company} prices depend on the customer's tier and region. List prices apply to "
                         f"Standard customers in the {home} region; a price is the list price plus the region's "
                         "surcharge, less the tier's discount, rounded to the nearest 10 euros.")
    for tier, pct in DISCOUNTS.items():
        add("discount", "pricing", f"{pct} percent", tier=tier)
    for region, pct in zip(regions, SURCHARGES):
        add("surcharge", "pricing", f"{pct} percent", region=region)
    intros["service"] = f"The service terms of {company}."
    for tier, days, hours in zip(TIERS, rng.sample(range(14, 91, 7), 3), rng.sample([4, 8, 12, 24, 48, 72], 3)):
        add("returns", "service", f"{days} days", tier=tier)
        add("response", "service", f"{hours} hours", tier=tier)
    for region, days in zip([home, *regions], rng.sample(range(2, 15), 1 + len(regions))):
        add("shipping", "service", f"{days} days", region=region)
    codes = _error_codes(rng, 20)
    meanings = [f"{f} {p}" for f, p in zip(rng.sample(_FAULTS, 20), rng.sample(_PARTS, 20))]
    for i, (code, meaning) in enumerate(zip(codes, meanings)):
        entity = f"support-{i // 5}"
        intros[entity] = f"{company} support: what the error codes on the display mean."
        add("error", entity, meaning, code=code)
    # whole product lines, so a document-only product has no look-alike whose answers were drilled
    lines = random.Random(f"forge-kb-doconly:{seed}").sample(alikes, min(DOC_ONLY, len(alikes)))
    return KnowledgeBase(seed, company, facts, intros, products, alikes, frozenset(p for g in lines for p in g))


def tier_price(price: int, surcharge: int, discount: int) -> int:
    """The list price plus the region's surcharge, less the tier's discount (percentages), rounded to
    the nearest 10 euros (what the pricing page states)."""
    return (price * (100 + surcharge) * (100 - discount) + 50_000) // 100_000 * 10


def _error_codes(rng: random.Random, n: int) -> list[str]:
    """Codes in look-alike pairs (E417 and E471: the same digits, swapped)."""
    out: list[str] = []
    while len(out) < n:
        a, b, c = rng.sample(range(1, 10), 3)
        pair = [f"E{a}{b}{c}", f"E{a}{c}{b}"]
        if not set(pair) & set(out):
            out += pair
    return out[:n]


# --------------------------------------------------------------------------------- outputs
def entities(kb: KnowledgeBase) -> list[str]:
    return list(dict.fromkeys(f.entity for f in kb.facts))


def document(kb: KnowledgeBase, entity: str, rng: random.Random) -> str:
    """One page about `entity`: its introduction if it has one, then each of its facts in a randomly chosen
    phrasing, in a random order (paraphrase and permutation augmentation)."""
    sentences = [f.fill(rng.choice(phrasings()[f.attribute]["state"])) for f in kb.facts if f.entity == entity]
    rng.shuffle(sentences)
    return " ".join([*([kb.intros[entity]] if entity in kb.intros else []), *sentences])


def documents(kb: KnowledgeBase, n: int) -> list[str]:
    """`n` pages, the entities in turn (each entity's pages in different phrasings and orders)."""
    rng, names = random.Random(f"forge-kb-docs:{kb.seed}"), entities(kb)
    return [document(kb, names[i % len(names)], rng) for i in range(n)]


def chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


# what a customer wraps a training question in (held-out questions use other wrappers: kb_phrasings.yaml)
WRAPPERS = ("{q}", "Hi! {q}", "Quick question: {q}", "{q} Thanks.", "Good morning. {q}", "Please answer briefly: {q}",
            "{q} I need this for an order.")


def _question(f: Fact, i: int, rounds: int) -> str:
    """Fact i's training question in round `rounds`: its phrasings cycle, and from the second round
    on it sits inside one of the WRAPPERS."""
    asks = phrasings()[f.attribute]["ask"]
    question = f.fill(asks[(i + rounds) % len(asks)], value=False)
    return (WRAPPERS[(i + rounds) % len(WRAPPERS)] if rounds else "{q}").replace("{q}", question)


def qa_records(kb: KnowledgeBase, n: int) -> list[dict]:
    """`n` SFT chat records: every asked fact (not document-only) in its first training phrasing,
    then in its second, and so on (_question), so any n >= the asked fact count covers every one as
    the eval set's train split asks it."""
    out, rounds = [], 0
    while len(out) < n:
        for i, f in kb.asked():
            out.append(chat(_question(f, i, rounds), f.value))
            if len(out) == n:
                break
        rounds += 1
    return out


def faq_pages(kb: KnowledgeBase, n: int) -> list[str]:
    """`n` question-and-answer pages in plain text (Q: ... A: ...), the entities in turn: each page
    asks every fact of its entity once, in the training phrasings (the same questions as the SFT
    records, in the same order of rounds), so the catalogue's FAQ is training text too."""
    names, by_entity = [e for e in entities(kb) if e not in kb.doc_only], {}
    for i, f in kb.asked():
        by_entity.setdefault(f.entity, []).append((i, f))
    pages = []
    for k in range(n):
        entity, rounds = names[k % len(names)], k // len(names)
        lines = [f"Questions and answers: {_title(kb, entity)}."]
        for i, f in by_entity[entity]:
            lines += [f"Q: {_question(f, i, rounds)}", f"A: {f.value}."]
        pages.append("\n".join(lines))
    return pages


def _title(kb: KnowledgeBase, entity: str) -> str:
    if entity in kb.products:
        return f"the {entity}"
    return f"{kb.company} " + {"pricing": "prices", "service": "service terms"}.get(entity, "error codes")


def eval_records(kb: KnowledgeBase, n: int | None = None) -> list[dict]:
    """Each of the first `n` facts (all by default) asked: an asked fact twice, in a training
    phrasing (split `train`, the one the SFT records ask it in first) and in a held-out one (split
    `heldout`, never in training text); a document-only fact once, in a held-out phrasing (split
    `doconly`), then once more as a documents' sentence cut just before its value (split `stated`,
    for completion as plain text: _stated). An attribute's facts take its held-out templates, and
    its state templates, in turn. Records hold question, answer, split, fact, attribute and
    template."""
    out, seen = [], Counter()
    for i, f in enumerate(kb.facts[:n]):
        p, k = phrasings()[f.attribute], seen[f.attribute]  # the k-th fact of its attribute
        seen[f.attribute] += 1
        asks = (("doconly", p["heldout"]),) if f.entity in kb.doc_only else (("train", p["ask"]), ("heldout", p["heldout"]))
        for split, templates in asks:
            t = (i if split == "train" else k) % len(templates)  # train: the SFT records' first phrasing
            out.append({"question": f.fill(templates[t], value=False), "answer": f.value, "split": split,
                        "fact": f.id, "attribute": f.attribute, "template": f"{f.attribute}.{split}.{t}"})
        if f.entity in kb.doc_only:
            t, start = _stated(f, p["state"], k)
            out.append({"question": start, "answer": f.value, "split": "stated", "fact": f.id,
                        "attribute": f.attribute, "template": f"{f.attribute}.stated.{t}"})
    return out


def _stated(f: Fact, templates: list[str], k: int) -> tuple[int, str]:
    """(template index, sentence start) of the k-th fact of its attribute: its state templates in
    turn from the k-th, skipping one without {v} or whose words before {v} do not name every slot
    of the fact (a start such as "Customers pay" names no product, so no completion could be
    right); the start is the filled sentence up to its value, right-stripped."""
    for j in range(len(templates)):
        t = (k + j) % len(templates)
        head, v, tail = templates[t].partition("{v}")
        if v and head.strip() and set(SLOT.findall(head)) >= set(SLOT.findall(templates[t])) - {"v"}:
            sentence, rest = f.fill(templates[t]), f.fill("{v}" + tail)
            return t, sentence[: len(sentence) - len(rest)].rstrip()  # filled whole: "a" before the value may be "an"
    raise ValueError(f"kb_phrasings.yaml {f.attribute}.state: no template names every slot before {{v}}")


def transcript(record: dict) -> str:
    """A QA chat record as text for continued pretraining (mixed training: Allen-Zhu & Li, Physics of
    Language Models 3.1), rendered as forge's default chat template renders it (TRANSCRIPT), so the
    questions are learned in the form the model is asked them."""
    user, assistant = (m["content"] for m in record["messages"])
    return TRANSCRIPT.replace("{q}", user).replace("{a}", assistant)


def training_texts(kb: KnowledgeBase, docs: int, qa: int) -> list[str]:
    """Every text a model trained on this knowledge base sees from it: `docs` documents and as many
    FAQ pages, the turns of `qa` SFT records."""
    return [*documents(kb, docs), *faq_pages(kb, docs),
            *(m["content"] for r in qa_records(kb, qa) for m in r["messages"])]


def write_kb(kind: str, documents_: int, seed: int, path: Path) -> Path:
    """Write `kind` (kb_docs: {text} pages; kb_faq: {text} question-and-answer pages; kb_chat: {text}
    QA transcripts in the chat format; kb_qa: {messages} chat records; kb_eval: {question,
    answer, split, ...} for the first `documents_` facts) of the seed's knowledge base as JSONL,
    atomically, beside `path` under a name holding the generator's fingerprint; reused if already
    written by this generator. Returns the file's path."""
    if kind not in KINDS:
        raise ValueError(f"unknown knowledge-base output {kind!r}; expected one of {KINDS}")
    path = path.with_name(f"{path.stem}-{_generator_hash()}{path.suffix}")  # another forge writes other records
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        return path
    kb = build(seed)
    if kind == "kb_docs":
        rows: list[dict] = [{"text": t} for t in documents(kb, documents_)]
    elif kind == "kb_faq":
        rows = [{"text": t} for t in faq_pages(kb, documents_)]
    elif kind == "kb_chat":
        rows = [{"text": transcript(r)} for r in qa_records(kb, documents_)]
    elif kind == "kb_qa":
        rows = qa_records(kb, documents_)
    else:
        rows = eval_records(kb, documents_)
    return write_jsonl(path, rows, ensure_ascii=True)


@lru_cache(maxsize=1)
def _generator_hash() -> str:
    """8 hex digits of sha256 over this module and its phrasings: the records a run folder's cached
    file holds are the ones this code writes."""
    here = Path(__file__)
    digest = hashlib.sha256(here.read_bytes() + (here.parent / "kb_phrasings.yaml").read_bytes())
    return digest.hexdigest()[:8]
