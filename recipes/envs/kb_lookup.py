"""An agentic RFT environment on the quickstart's knowledge base (forge/gen/kb.py): asked about a
product's attribute, the policy must call the tool `lookup(product, attribute)` and answer with the
value it returns. Reward: 1 for an answer that is the value; otherwise partial credit for the
best lookup made: 0.4 for the right attribute, 0.2 for the right product (dense enough for a tiny
model's groups). `python recipes/envs/kb_lookup.py` writes recipes/data/kb_agent_tasks.jsonl
(every product and attribute, asked in two phrasings) and kb_agent_demos.jsonl (demonstration trajectories of the
training tasks, never of held-out ones, for an SFT warm-up; OpenAI chat records with tool calls).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge.data.mixing import in_holdout
from forge.gen.kb import build, phrasings

ATTRIBUTES = ("price", "weight", "warranty", "battery", "factory", "launched")
SYSTEM = "Call lookup(product, attribute) to read a fact; attributes: " + ", ".join(ATTRIBUTES) + "."
SOURCE, HOLDOUT = "kb_tasks", 0.25  # the recipe's source name and holdout: the held-out tasks are its split's


def facts() -> dict[tuple[str, str], str]:
    return {(dict(f.slots)["p"], f.attribute): f.value for f in build(0).facts if f.attribute in ATTRIBUTES}


class KbLookup:
    """One episode: reset(task) opens it, the policy's lookup calls are answered from the knowledge base,
    its first turn without a tool call is the answer (step scores it and ends the episode)."""

    FACTS = facts()

    def __init__(self) -> None:
        self.tools = {"lookup": self.lookup}
        self.task: dict[str, Any] = {}
        self.credit = 0.0

    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        self.task, self.credit = task, 0.0
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]

    def lookup(self, product: str = "", attribute: str = "") -> str:
        product, attribute = str(product).strip(), str(attribute).strip().lower()
        credit = 0.4 * (attribute == self.task["attribute"]) + 0.2 * (product == self.task["product"])
        self.credit = max(self.credit, credit)
        return self.FACTS.get((product, attribute)) or f"unknown: no {attribute} for {product}"

    def step(self, action: str) -> tuple[None, float, bool]:
        # the answer is the value itself (as the demonstrations give it): a substring test would pay
        # "12 years" for "2 years", and an answer echoing several lookups for any of them
        correct = normal(action) == normal(self.task["answer"])
        return None, 1.0 if correct else self.credit, True


def normal(text: str) -> str:
    """Lower case, spaces collapsed, without the closing full stop."""
    return " ".join(text.lower().split()).rstrip(".!").strip()


def tasks(per_fact: int = 2) -> list[dict[str, str]]:
    """Every product and attribute, each asked in `per_fact` training phrasings (spread over its
    list): the held-out split holds out questions, not facts, as the quickstart does, so a policy
    that picks the attribute by the product alone, not by the question, fails it."""
    out = []
    for i, ((product, attribute), value) in enumerate(sorted(facts().items())):
        asks = phrasings()[attribute]["ask"]
        for k in range(per_fact):
            ask = asks[(i + k * len(asks) // per_fact) % len(asks)]
            out.append({"prompt": ask.replace("{p}", product), "product": product, "attribute": attribute,
                        "answer": value})
    return out


def demo(task: dict[str, str]) -> dict[str, Any]:
    call = {"id": "call_0", "type": "function",
            "function": {"name": "lookup", "arguments": {"product": task["product"], "attribute": task["attribute"]}}}
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "content": task["answer"], "tool_call_id": "call_0"},
                         {"role": "assistant", "content": task["answer"]}]}


def write_data(folder: Path) -> None:
    """The tasks, and a demonstration of every training task (a tiny model learns to copy the
    product's name into its call only from enough of them; the first 96 by product taught none)."""
    rows = tasks()
    train = [t for n, t in enumerate(rows, start=1) if not in_holdout(SOURCE, n, HOLDOUT)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kb_agent_tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in rows))
    (folder / "kb_agent_demos.jsonl").write_text("".join(json.dumps(demo(t)) + "\n" for t in train))


if __name__ == "__main__":
    write_data(Path(__file__).resolve().parent.parent / "data")
