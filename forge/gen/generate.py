"""Generated text, so the quickstart runs offline with data forge makes itself.

`stories` is simple general English (a stand-in for curated general data); `facts` is a small
fictional product catalogue (a stand-in for an organization's proprietary domain data). Both are
deterministic in their seed and written once as JSONL, so they get a content hash like any file.
"""
from __future__ import annotations

import random
from pathlib import Path

from forge.files import write_jsonl

_NAMES = ["Mia", "Leo", "Ava", "Sam", "Zoe", "Max", "Ben", "Lily", "Tom", "Emma", "Noah", "Ella"]
_ANIMALS = ["cat", "dog", "bird", "fox", "rabbit", "duck", "bear", "frog", "horse", "mouse"]
_PLACES = ["park", "forest", "garden", "river", "beach", "farm", "school", "hill", "lake", "town"]
_THINGS = ["ball", "kite", "book", "hat", "box", "boat", "cake", "flower", "shell", "key"]
_FEELINGS = ["happy", "sad", "brave", "tired", "curious", "scared", "proud", "kind"]
_COLOURS = ["red", "blue", "green", "yellow", "small", "big", "shiny", "old"]

_PRODUCTS = ["Zephyr", "Aurora", "Basalt", "Cobalt", "Dynamo", "Ember", "Fjord", "Granite", "Helix", "Ion"]
_PARTS = ["valve", "pump", "sensor", "gasket", "controller", "bearing", "filter", "rotor"]
_MATERIALS = ["titanium", "ceramic", "steel", "copper", "graphite", "nylon"]
_SITES = ["Oslo", "Lyon", "Austin", "Osaka", "Porto", "Quebec", "Tartu", "Perth"]


def _story(rng: random.Random) -> str:
    name, animal, place = rng.choice(_NAMES), rng.choice(_ANIMALS), rng.choice(_PLACES)
    thing, feeling, colour = rng.choice(_THINGS), rng.choice(_FEELINGS), rng.choice(_COLOURS)
    friend = rng.choice([n for n in _NAMES if n != name])
    lines = [
        f"Once upon a time, {name} went to the {place} with a {colour} {thing}.",
        f"At the {place}, {name} saw a little {animal}.",
        f"The {animal} was {feeling} because it had lost its {thing}.",
        f"{name} said, \"Do not be {feeling}, little {animal}. I will help you.\"",
        f"{name} and {friend} looked for the {thing} all day.",
        f"At last they found the {thing} under a {colour} tree.",
        f"The {animal} was happy, and {name} went home with a big smile.",
    ]
    keep = rng.randint(4, len(lines))
    return " ".join(lines[:keep])


def _facts(rng: random.Random) -> str:
    product = f"{rng.choice(_PRODUCTS)}-{rng.randint(1, 9)}"
    part, material, site = rng.choice(_PARTS), rng.choice(_MATERIALS), rng.choice(_SITES)
    pressure, temp, years = rng.choice(range(10, 90, 5)), rng.choice(range(40, 160, 10)), rng.randint(2, 12)
    lines = [
        f"The {product} {part} is made of {material}.",
        f"The {product} {part} is rated for {pressure} bar at {temp} degrees.",
        f"Every {product} {part} is built at the {site} plant.",
        f"Replace the {product} {part} every {years} years.",
        f"Question: What is the {product} {part} made of? Answer: {material}.",
        f"Question: Where is the {product} {part} built? Answer: {site}.",
    ]
    rng.shuffle(lines)
    return " ".join(lines[: rng.randint(3, len(lines))])


def stories(documents: int, seed: int) -> list[str]:
    """`documents` generated stories (the same ones write_generated writes for this seed)."""
    rng = random.Random(seed)
    return [_story(rng) for _ in range(documents)]


def write_generated(kind: str, documents: int, seed: int, path: Path) -> Path:
    """Write `documents` generated documents of `kind` (stories | facts) as JSONL (atomically;
    reused if already written)."""
    if kind.startswith("kb_"):  # the knowledge base's documents, QA records and eval set (forge/gen/kb.py)
        from forge.gen.kb import write_kb

        return write_kb(kind, documents, seed, path)
    if kind.startswith("harvest_"):  # forge-tiny's curated sets (forge/gen/curated.py)
        from forge.gen.curated import write_curated

        return write_curated(kind.removeprefix("harvest_"), documents, seed, path, stories=stories)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        return path
    make = {"stories": _story, "facts": _facts}[kind]
    rng = random.Random(seed)
    return write_jsonl(path, ({"text": make(rng)} for _ in range(documents)), ensure_ascii=True)
