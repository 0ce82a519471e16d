"""Writes recipes/data/nova_rft.jsonl: 120 OpenAI-RFT records (Nova's RFT format, generated here,
no third-party text): `python recipes/data/nova_rft_make.py`."""
import json
from pathlib import Path

ANIMALS = ["cat", "dog", "bird", "fish", "frog", "bear", "duck", "fox", "lion", "mouse", "owl", "pig"]
THINGS = ["the park", "a red ball", "the rain", "a big tree", "the moon", "a small boat", "cake", "the sea", "snow", "a song"]


def records():
    for i in range(120):
        animal, thing = ANIMALS[i % len(ANIMALS)], THINGS[(i // len(ANIMALS)) % len(THINGS)]
        yield {"id": f"story-{i:03d}",
               "messages": [{"role": "system", "content": "You tell very short stories."},
                            {"role": "user", "content": f"Tell a one-sentence story about a {animal} and {thing}."}],
               "reference_answer": {"animal": animal, "max_words": 20},
               "topic": thing}


if __name__ == "__main__":
    out = Path(__file__).with_name("nova_rft.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in records()))
    print(f"wrote {out}")
