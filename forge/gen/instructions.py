"""forge-tiny's alignment data, generated offline: `instructions` (chat records for SFT) and
`preferences` (prompt, chosen, rejected for DPO), each a set of small SKILLS checkable by exact match:
copy a phrase, first / last word of a sentence, uppercase a word, the larger / smaller of two numbers,
the module that provides X (recall of harvested docstrings), and extractive QA over a context passage
(harvested sentences, generated product facts with look-alike distractors). Several phrasings per
task; held-out records take NEW arguments (sentences of held-out modules, held-out number pairs,
words, products), so a held-out prompt tests the skill rather than a memorised answer.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from forge.gen.harvest import Doc, held_out, sentences

EOS = "</s>"  # the scratch tokenizer's end of turn (forge.scratch), as DEFAULT_CHAT_TEMPLATE renders it
Record = dict  # a JSONL record: {"messages": [...], "task": ...} or {"prompt", "chosen", "rejected", "task"}

COPY = ["Repeat this phrase: {x}", "Say exactly this: {x}", "Copy the text: {x}", "Echo back: {x}",
        "Please repeat after me: {x}"]
FIRST = ["What is the first word of this sentence? {x}", "Sentence: {x}\nWhat is its first word?",
         "Give the first word of the following text: {x}", "Which word does this sentence start with? {x}"]
LAST = ["What is the last word of this sentence? {x}", "Sentence: {x}\nWhat is its last word?",
        "Give the last word of the following text: {x}", "Which word does this sentence end with? {x}"]
UPPER = ["Write the word {x} in capital letters.", "Uppercase this word: {x}", "Convert {x} to upper case.",
         "Spell {x} in uppercase letters."]
LARGER = ["Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?", "Of {a} and {b}, which is greater?",
          "Pick the larger number: {a}, {b}"]
SMALLER = ["Which is smaller, {a} or {b}?", "Which number is less: {a} or {b}?", "Of {a} and {b}, which is lower?",
           "Pick the smaller number: {a}, {b}"]
MODULE = ["Which module provides {x}?", "Name the module that provides {x}.", "Complete: the module that provides {x} is",
          "What is the name of the Python module that provides {x}?"]
CONTEXT = ["Context: {c}\nQuestion: {q}", "Read the passage and answer.\n{c}\n{q}", "{c}\n\nAnswer from the text above: {q}",
           "Passage: {c}\nQ: {q}"]

_PRODUCTS = ["Zephyr", "Aurora", "Basalt", "Cobalt", "Dynamo", "Ember", "Fjord", "Granite", "Helix", "Ion", "Juniper",
             "Krypton", "Lumen", "Magnet", "Nimbus", "Onyx", "Pulsar", "Quartz", "Radian", "Sierra"]
_PARTS = ["valve", "pump", "sensor", "gasket", "controller", "bearing", "filter", "rotor"]
_MATERIALS = ["titanium", "ceramic", "steel", "copper", "graphite", "nylon", "brass", "carbon"]
_SITES = ["Oslo", "Lyon", "Austin", "Osaka", "Porto", "Quebec", "Tartu", "Perth", "Dakar", "Lima"]
_FACT_QUESTIONS = {
    "material": ["What is the {p} made of?", "Which material is the {p} made from?"],
    "site": ["Where is the {p} built?", "At which plant is the {p} made?"],
    "pressure": ["What pressure is the {p} rated for?", "What is the rated pressure of the {p}?"],
    "years": ["How often should the {p} be replaced?", "What is the replacement interval of the {p}?"],
}
_RETURNS = re.compile(r"^Returns? (.{5,70})\.$")
_STARTS = re.compile(r"^(?:This (?:module|package) |The \w+ module |Module )?(?:provides|implements|contains|defines|"
                     r"offers)\s+(.{8,90})\.$")


@dataclass
class Pools:
    """The arguments tasks draw from, each split into training and held-out parts."""

    sentences: tuple[list[str], list[str]]
    words: tuple[list[str], list[str]]
    returns: tuple[list[tuple[str, str]], list[tuple[str, str]]]   # (function, what it returns)
    modules: tuple[list[tuple[str, str]], list[tuple[str, str]]]   # (module, what it provides)


def pools(docs: list[Doc], holdout: float) -> Pools:
    """Sentences, words, 'returns' facts and 'provides' facts from the harvest; a doc's arguments are
    held out when its module is (forge.gen.harvest.held_out), so held-out prompts are new."""
    sents: tuple[list, list] = ([], [])
    rets: tuple[list, list] = ([], [])
    mods: tuple[list, list] = ([], [])
    counts: Counter[str] = Counter()
    for d in docs:
        side = held_out(d.unit, holdout)
        for s in sentences(d.text):
            words = s.split()
            if 5 <= len(words) <= 14 and s.isascii() and re.fullmatch(r"[A-Za-z][\w ,'()-]*[a-z]\.", s):
                sents[side].append(s)
                counts.update(w for w in words if w.isalpha() and w.islower() and 3 <= len(w) <= 9)
        first = sentences(d.text)[:1]
        m = _RETURNS.match(first[0]) if first and d.kind == "function" and d.name else None
        if m and "," not in m.group(1):
            rets[side].append((d.name.rpartition(".")[2], m.group(1)))
        m = _STARTS.match(first[0]) if first and d.kind == "module" else None
        if m and not any(p.startswith("_") for p in d.module.split(".")):
            # the docstring is trained on (its module is not held out); only the question may be
            mods[held_out("provides:" + d.module, holdout)].append((d.module, m.group(1)))
    common = sorted(w for w, c in counts.items() if c >= 5)
    words = ([w for w in common if not held_out("word:" + w, holdout)], [w for w in common if held_out("word:" + w, holdout)])
    return Pools(sents, words, rets, mods)


def _strip(word: str) -> str:
    return word.strip(".,;:!?\"'()")


def _copy(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    words = rng.choice(p.sentences[side]).rstrip(".").split()
    n = rng.randint(2, min(6, len(words)))
    i = rng.randrange(len(words) - n + 1)
    phrase = " ".join(words[i:i + n])
    wrong = " ".join(words[i:i + n - 1]) if n > 2 else words[i]
    return rng.choice(COPY).format(x=phrase), phrase, wrong


def _first(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    s = rng.choice(p.sentences[side])
    words = [_strip(w) for w in s.split()]
    return rng.choice(FIRST).format(x=s), words[0], words[-1]


def _last(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    s = rng.choice(p.sentences[side])
    words = [_strip(w) for w in s.split()]
    return rng.choice(LAST).format(x=s), words[-1], words[0]


def _upper(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    w = rng.choice(p.words[side])
    return rng.choice(UPPER).format(x=w), w.upper(), w.capitalize()


def _numbers(rng: random.Random, side: int) -> tuple[int, int]:
    while True:
        a, b = rng.randrange(1000), rng.randrange(1000)
        if a != b and held_out(f"pair:{min(a, b)}:{max(a, b)}", 0.1) == bool(side):
            return a, b


def _larger(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    a, b = _numbers(rng, side)
    return rng.choice(LARGER).format(a=a, b=b), str(max(a, b)), str(min(a, b))


def _smaller(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    a, b = _numbers(rng, side)
    return rng.choice(SMALLER).format(a=a, b=b), str(min(a, b)), str(max(a, b))


def _module(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    module, what = rng.choice(p.modules[side])
    other = rng.choice([m for m, _ in p.modules[0] if m != module] or ["os"])
    return rng.choice(MODULE).format(x=what), module, other


def _returns(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    (name, what), (_, wrong) = rng.choice(p.returns[side]), rng.choice(p.returns[side])
    passage = [f"{name}: Return {what}.", *rng.sample(p.sentences[side], rng.randint(1, 2))]
    rng.shuffle(passage)
    q = rng.choice([f"What does {name} return?", f"What is returned by {name}?"])
    return rng.choice(CONTEXT).format(c=" ".join(passage), q=q), what, wrong


def _facts(rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    while True:
        names = [f"{rng.choice(_PRODUCTS)}-{rng.randint(1, 9)} {rng.choice(_PARTS)}" for _ in range(rng.randint(2, 3))]
        if len(set(names)) == len(names) and held_out("product:" + names[0], 0.1) == bool(side):
            break
    facts = {n: {"material": rng.choice(_MATERIALS), "site": rng.choice(_SITES),
                 "pressure": f"{rng.randrange(10, 90, 5)} bar", "years": f"every {rng.randint(2, 12)} years"}
             for n in names}
    lines = []
    for n, f in facts.items():
        lines += [f"The {n} is made of {f['material']}.", f"The {n} is built at the {f['site']} plant.",
                  f"The {n} is rated for {f['pressure']}.", f"Replace the {n} {f['years']}."]
    rng.shuffle(lines)
    attr = rng.choice(sorted(_FACT_QUESTIONS))
    target, other = names[0], names[1]
    wrong = facts[other][attr] if facts[other][attr] != facts[target][attr] else \
        {"material": "paper", "site": "Mars", "pressure": "1 bar", "years": "every 99 years"}[attr]
    q = rng.choice(_FACT_QUESTIONS[attr]).format(p=target)
    return rng.choice(CONTEXT).format(c=" ".join(lines), q=q), facts[target][attr], wrong


TASKS: dict[str, Callable[[random.Random, Pools, int], tuple[str, str, str]]] = {
    "copy": _copy, "first_word": _first, "last_word": _last, "uppercase": _upper, "larger": _larger,
    "smaller": _smaller, "module": _module, "returns_qa": _returns, "facts_qa": _facts,
}


def _usable(p: Pools) -> list[str]:
    needs = {"copy": p.sentences, "first_word": p.sentences, "last_word": p.sentences, "uppercase": p.words,
             "module": p.modules, "returns_qa": p.returns}
    return [t for t in TASKS if needs.get(t, ([1], [1]))[0]]


def _draw(task: str, rng: random.Random, p: Pools, side: int) -> tuple[str, str, str]:
    """One (prompt, answer, wrong answer) of `task` whose wrong answer differs from the answer."""
    for _ in range(20):
        try:
            prompt, answer, wrong = TASKS[task](rng, p, side)
        except IndexError:  # the side's pool is empty
            return "", "", ""
        if answer != wrong:
            return prompt, answer, wrong
    return prompt, answer, answer + " no"


def _echo(rng: random.Random, p: Pools, side: int) -> str:
    """Text to learn copying from (skills only): 8-40 random common words, or 1-3 sentences, said
    twice. Random words are unpredictable the first time and wholly predictable the second, the
    signal that forms induction heads within a few hundred steps (Olsson et al. 2022)."""
    if rng.random() < 0.6 and p.words[side]:
        passage = " ".join(rng.choice(p.words[side]) for _ in range(rng.randint(8, 40)))
    else:
        passage = " ".join(rng.sample(p.sentences[side], min(len(p.sentences[side]), rng.randint(1, 3))))
    return f"{passage}\n{passage}"


def generate(kind: str, p: Pools, count: int, seed: int, holdout: float) -> list[tuple[Record, bool]]:
    """`count` records of `kind` (instructions | preferences | skills), each with whether it is held
    out (a `holdout` share of each task, with held-out arguments); tasks in equal shares, round
    robin. `skills` is the instructions' kind of record as plain text in forge's chat format, every
    other record a passage said twice: for pretraining and mid-training stages, which learn the
    skills' circuits (copying above all) from every token, as mid-training mixes such as OLMo 2's
    Dolmino carry instruction data."""
    rng = random.Random(f"{kind}:{seed}")
    tasks, out = _usable(p), []
    for i in range(count):
        task = tasks[i % len(tasks)]
        side = int(rng.random() < holdout)
        prompt, answer, wrong = _draw(task, rng, p, side)
        if not prompt:  # no held-out arguments for the task (a small harvest): a training record
            side = 0
            prompt, answer, wrong = _draw(task, rng, p, side)
        if kind == "skills" and i % 2:  # every other skills record: a passage said twice
            out.append(({"text": _echo(rng, p, side if p.sentences[side] else 0), "task": "echo"},
                        bool(side and p.sentences[side])))
            continue
        if kind == "instructions":
            record = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                      "task": task}
        elif kind == "skills":
            record = {"text": f"<|user|>\n{prompt}{EOS}<|assistant|>\n{answer}", "task": task}
        else:
            record = {"prompt": prompt, "chosen": answer, "rejected": wrong, "task": task}
        out.append((record, bool(side)))
    return out
