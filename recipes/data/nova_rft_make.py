"""Writes the Nova-format data of recipes/nova_rft.yaml (generated here, no third-party text):
recipes/data/nova_sft.jsonl, 120 Bedrock conversation records (SFT), and recipes/data/nova_rft.jsonl,
120 OpenAI-RFT records (RFT): `python recipes/data/nova_rft_make.py`."""
import json
from pathlib import Path

ANIMALS = ["cat", "dog", "bird", "fish", "frog", "bear", "duck", "fox", "lion", "mouse", "owl", "pig"]
THINGS = ["the park", "a red ball", "the rain", "a big tree", "the moon", "a small boat", "cake", "the sea", "snow", "a song"]
VERBS = ["liked", "saw", "found", "loved", "played with", "looked at"]
SYSTEM = "You tell very short stories."


def prompt(i):
    animal, thing = ANIMALS[i % len(ANIMALS)], THINGS[(i // len(ANIMALS)) % len(THINGS)]
    return animal, thing, f"Tell a one-sentence story about a {animal} and {thing}."


def rft_records():
    for i in range(120):
        animal, thing, ask = prompt(i)
        yield {"id": f"story-{i:03d}", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}],
               "reference_answer": {"animal": animal, "max_words": 20}, "topic": thing}


def sft_records():
    for i in range(120):
        animal, thing, ask = prompt(i + 7)  # other pairs than the RFT prompts'
        story = f"The {animal} {VERBS[i % len(VERBS)]} {thing}."
        yield {"schemaVersion": "bedrock-conversation-2024", "system": [{"text": SYSTEM}],
               "messages": [{"role": "user", "content": [{"text": ask}]},
                            {"role": "assistant", "content": [{"text": story}]}]}


if __name__ == "__main__":
    here = Path(__file__).parent
    for name, records in (("nova_rft.jsonl", rft_records()), ("nova_sft.jsonl", sft_records())):
        (here / name).write_text("".join(json.dumps(r) + "\n" for r in records))
        print(f"wrote {here / name}")
