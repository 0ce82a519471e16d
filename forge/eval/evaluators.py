"""Evaluators: plain functions over a model (and tokenizer) and data, each returning named figures.

perplexity per source, retention and domain gain against the starting checkpoint, preference
accuracy, and custom evaluators loaded from `file.py:function`; fact recall and instruction
following by greedy generation live in forge.eval.recall. forge.eval.builtin makes them the rows
of forge.eval.table, which forge.eval.suite runs for a recipe.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from forge.errors import ForgeError
from forge.eval.recall import fact_recall, normalize_answer, separator_ids  # noqa: F401  (the suite's evaluators)
from forge.lm.perplexity import source_losses
from forge.usercode import load_function


def perplexity(model, blocks: dict[str, torch.Tensor], batch_size: int, device) -> dict[str, float]:
    """`ppl.<source>` and `loss.<source>` on each source's held-out blocks."""
    out = {}
    for name, v in source_losses(model, blocks, batch_size, device).items():
        out[f"loss.{name}"], out[f"ppl.{name}"] = v.loss, v.ppl
    return out


def relative_change(ppl: dict[str, float], start: dict[str, float], general: list[str],
                    domain: list[str]) -> dict[str, float]:
    """Against the starting checkpoint's perplexities: `retention.<s>` = ppl/start - 1 for general
    sources (the forgetting: 0.10 = 10% worse), `domain_gain.<s>` = 1 - ppl/start for domain ones."""
    out = {}
    for name in general:
        if f"ppl.{name}" in ppl and f"ppl.{name}" in start:
            out[f"retention.{name}"] = ppl[f"ppl.{name}"] / start[f"ppl.{name}"] - 1.0
    for name in domain:
        if f"ppl.{name}" in ppl and f"ppl.{name}" in start:
            out[f"domain_gain.{name}"] = 1.0 - ppl[f"ppl.{name}"] / start[f"ppl.{name}"]
    return out


def retention(model, start_model, blocks: dict[str, torch.Tensor], batch_size: int, device) -> dict[str, float]:
    """Forgetting on general text: `retention.<s>` = ppl(model) / ppl(start_model) - 1."""
    now, start = perplexity(model, blocks, batch_size, device), perplexity(start_model, blocks, batch_size, device)
    return relative_change(now, start, list(blocks), [])


# ------------------------------------------------------------------------ preference accuracy
@torch.no_grad()
def _response_logprob(model, ids: list[int], start: int, device) -> float:
    """Sum of log p(token) over ids[start:], each given everything before it."""
    x = torch.tensor([ids], device=device)
    logits = model(input_ids=x).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(1, x[0, 1:, None])[:, 0]
    return logp[start - 1:].sum().item()


def preference_accuracy(model, tokenizer, pairs: list[tuple[str, str, str]], device,
                        max_len: int = 512, separator: str = "eos") -> dict[str, float]:
    """Share of (prompt, chosen, rejected) where chosen's summed log-likelihood after the prompt is
    higher. With an empty prompt the pair's longest shared token prefix is the prompt."""
    if not pairs:
        raise ForgeError("preference accuracy: no chosen/rejected pairs to score")
    was_training = model.training
    model.eval()
    bos = separator_ids(tokenizer, separator)
    wins = 0
    for prompt, chosen, rejected in pairs:
        p = bos + tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else list(bos)
        c = p + tokenizer(chosen, add_special_tokens=False)["input_ids"]
        r = p + tokenizer(rejected, add_special_tokens=False)["input_ids"]
        c, r = c[:max_len], r[:max_len]
        start = len(p)
        while start < min(len(c), len(r)) and c[start] == r[start]:
            start += 1  # shared text is not what the preference is about
        start = max(start, 1)
        if start >= len(c) or start >= len(r):
            wins += len(c) > len(r)  # one is a prefix of the other (truncation): count as a tie, lost
            continue
        wins += _response_logprob(model, c, start, device) > _response_logprob(model, r, start, device)
    model.train(was_training)
    return {"preference_accuracy": wins / len(pairs)}


# --------------------------------------------------------------------------------- custom
def load_custom(spec: str, root: Path | None = None) -> Callable:
    """`file.py:function` (the file relative to `root`): the function, called as
    fn(model, tokenizer, sources, device) -> float or {name: float}."""
    return load_function(spec, root, "eval.custom", modules=False)


def run_custom(spec: str, fn: Callable, model, tokenizer, sources: dict, device) -> dict[str, float]:
    value = fn(model, tokenizer, sources, device)
    name = spec.rpartition(":")[2]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {name: float(value)}
    if isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()):
        return {f"{name}.{k}": float(v) for k, v in value.items()}
    raise ForgeError(f"eval.custom: {spec} returned {type(value).__name__}; expected a number or {{name: number}}")
