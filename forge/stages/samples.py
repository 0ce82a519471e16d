"""Sample tables, every `samples.every` steps, as MLflow tables (samples/step-N.json): prompts and
the policy's completions (SFT, RFT with rewards), and DPO's: the prompt, the chosen and rejected
replies, the policy's own greedy completion, and the implicit rewards beta * (log pi - log ref)
of chosen and rejected, with their margin."""
from __future__ import annotations

from typing import Any

import torch

from forge.lm.generation import Sampling, generate_ids
from forge.track.protocol import StageTracker
from forge.train.losses import IGNORE


def log_samples(tracker: StageTracker, step: int, prompts: list[list[dict[str, Any]]], completions: list[str],
                extra: dict[str, list[Any]] | None = None) -> None:
    """One MLflow table (samples/step-N.json): prompt, completion and any extra columns (rewards)."""
    table = {"step": [step] * len(completions),
             "prompt": [p[-1]["content"] for p in prompts],
             "completion": list(completions), **(extra or {})}
    tracker.log_table(table, f"samples/step-{step:07d}.json")


def _split(ids: list[int], labels: list[int]) -> tuple[list[int], list[int]]:
    """(prompt tokens, reply tokens): the reply is the labelled tokens, the prompt what precedes them."""
    first = next((i for i, x in enumerate(labels) if x != IGNORE), len(ids))
    return ids[:first], [t for t, x in zip(ids, labels) if x != IGNORE]


def log_dpo_samples(tracker: StageTracker, step: int, model: Any, tokenizer: Any, pairs: list[dict[str, Any]],
                    rewards: torch.Tensor, max_new_tokens: int) -> None:
    """Log the table (samples/step-N.json) of DPO sample `pairs`, with their implicit rewards
    (pairs, 2: chosen, rejected) and the policy's greedy completion of each prompt."""
    prompts: list[list[int]] = []
    chosen: list[str] = []
    rejected: list[str] = []
    for p in pairs:
        prompt, reply = _split(p["chosen_input_ids"], p["chosen_labels"])
        prompts.append(prompt)
        chosen.append(tokenizer.decode(reply, skip_special_tokens=True))
        rejected.append(tokenizer.decode(_split(p["rejected_input_ids"], p["rejected_labels"])[1],
                                         skip_special_tokens=True))
    completions = generate_ids(model, tokenizer, prompts, Sampling(max_new_tokens), model.device)
    texts = tokenizer.batch_decode(prompts, skip_special_tokens=True)
    log_samples(tracker, step, [[{"content": t}] for t in texts], completions,
                {"chosen": chosen, "rejected": rejected, "reward_chosen": rewards[:, 0].tolist(),
                 "reward_rejected": rewards[:, 1].tolist(), "margin": (rewards[:, 0] - rewards[:, 1]).tolist()})
