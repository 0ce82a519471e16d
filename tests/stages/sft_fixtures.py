"""A verifiable Q&A task for post-training tests: each thing has one colour; training questions use
three phrasings, held-out questions a fourth, so exact match on them measures learning, not recall."""
from __future__ import annotations

import json
from pathlib import Path

THINGS = {"apple": "red", "sky": "blue", "grass": "green", "sun": "yellow", "coal": "black", "snow": "white",
          "orange": "orange", "plum": "purple"}
TRAIN_PHRASINGS = ("What color is the {t}?", "Tell me the color of the {t}.", "Which color does the {t} have?",
                   "The {t} is which color?", "Name the color of the {t}.", "What is the color of a {t}?")
HELD_PHRASING = "What color does the {t} have?"


def write_qa(path: Path, repeats: int = 2) -> Path:
    rows = [{"prompt": p.format(t=t), "completion": c} for _ in range(repeats)
            for t, c in THINGS.items() for p in TRAIN_PHRASINGS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def held_out_prompts() -> list[tuple[list[dict], str]]:
    return [([{"role": "user", "content": HELD_PHRASING.format(t=t)}], c) for t, c in THINGS.items()]


def exact_match(model_dir: Path, max_new_tokens: int = 12) -> float:
    """Share of held-out phrasings answered exactly (greedy), with the checkpoint's own chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.data.formats import DEFAULT_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = tok.chat_template or DEFAULT_CHAT_TEMPLATE  # a base model has none
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hits = 0
    for messages, answer in held_out_prompts():
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
        hits += tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip() == answer
    return hits / len(THINGS)
