"""Mean reward: the model completes held-out prompts (as the rft stage prompts it: one user turn
in the chat template, forge.lm.generation.generate) and the recipe's reward functions
(forge.lm.rewards) score the completions. Reports `reward.<source>.mean` per source and
`reward.mean`, the weighted total the rft stage optimises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from forge.data.formats import ChatEncoder, FormatSpec
from forge.errors import ForgeError
from forge.lm.generation import Sampling, generate
from forge.lm.rewards import Reward, RewardError, unique_labels


def load_rewards(specs: list, root=None) -> list[Reward]:
    """The reward sources, resolved once (a bad file or module fails here, before any model loads).
    A Python source's worker process ends with its Reward (`close()`, or when it is dropped)."""
    return [Reward(spec, root) for spec in specs]


@dataclass(frozen=True)
class RewardRun:
    """How held-out prompts are completed for the mean reward (the recipe's eval.reward block)."""

    prompt_field: str
    sampling: Sampling
    device: Any
    batch_size: int = 8
    seed: int = 0  # sampled completions: the same draws for every model compared


def mean_reward(model, tokenizer, rows: list[dict], rewards: list[Reward], run: RewardRun,
                where: str = "eval.reward") -> dict[str, float]:
    """Generate `run.sampling.n` completions per row's prompt (greedy unless a temperature is set) and
    score them with every reward source; the figures are means over all completions."""
    if not rows:
        raise ForgeError(f"{where}: no prompts to complete")
    if not rewards:
        raise ForgeError(f"{where}: no reward functions")
    encoder = ChatEncoder(tokenizer, FormatSpec("prompt_completion"))
    names = unique_labels(rewards)
    totals = {name: 0.0 for name in names}
    weighted, count = 0.0, 0
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):  # the caller's random state is left as it was
        torch.manual_seed(run.seed)
        field, n = run.prompt_field, run.sampling.n
        for batch, i in enumerate(range(0, len(rows), run.batch_size)):
            chunk = rows[i:i + run.batch_size]
            messages = [[{"role": "user", "content": r[field]}] for r in chunk]
            texts = generate(model, tokenizer, encoder, messages, run.sampling, run.device)
            prompts = [r[field] for r in chunk for _ in range(n)]
            fields = {k: [r.get(k) for r in chunk for _ in range(n)] for k in chunk[0] if k != field}
            for reward, name in zip(rewards, names):
                try:
                    scores = reward(prompts, texts, fields, batch)
                except RewardError as e:
                    raise type(e)(f"{where}: {e}") from None  # RewardStopped stays one (runs end KILLED)
                totals[name] += sum(scores)
                weighted += reward.weight * sum(scores)
            count += len(texts)
    return {"reward.mean": weighted / count, **{f"reward.{name}.mean": totals[name] / count for name in names}}
