"""Training losses. Each returns the mean loss over a micro-batch's target tokens (0, not NaN, when it
has none); `target_count` gives that number, so a step can weight micro-batches by their token
counts (see forge.train.step)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
import torch.nn.functional as F

from forge.train import attention

IGNORE = -100  # label of a token that carries no loss (prompts, padding, other turns)


@dataclass
class Loss:
    """A micro-batch's mean loss and the kind's own figures of it (each a mean over the same
    targets), which forge.train.step weights by target count across micro-batches and ranks."""

    value: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # 0-d: the step reads nothing to the host


def causal_lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token loss over full packed blocks: every position but the last predicts one token."""
    loss: torch.Tensor = model(input_ids=batch, labels=batch, use_cache=False).loss  # a training step reads no cache
    return loss


def masked_lm_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, number of labelled tokens) for a packed or a padded batch (SFT).

    A packed batch carries position_ids that restart per example (and no attention mask); a padded
    one carries an attention mask."""
    labels, keep = _targets(batch)
    return F.cross_entropy(target_logits(model, batch, keep), _at(labels, keep), reduction="sum"), keep.sum()


def distilled_lm_loss_sum(model: torch.nn.Module, teacher: torch.nn.Module, batch: dict[str, torch.Tensor],
                          weight: float, collective: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """masked_lm_loss_sum where the tokens of `batch["teach"]` (replayed text) take, in place of
    `weight` of their cross-entropy, the KL divergence from `teacher`'s next-token distribution
    (distillation keeps its predictions on that text, not only its argmax; Learning without
    Forgetting, Li & Hoiem 2016). The teacher reads only the rows that hold taught tokens;
    `collective`: its forward is a collective (a sharded teacher), so it runs on every micro-batch,
    on one row when none is taught. Returns (sum, labelled tokens, the KL summed over the taught tokens)."""
    labels, keep = _targets(batch)
    logp = F.log_softmax(target_logits(model, batch, keep), dim=-1)  # once, for the cross-entropy and the KL
    ce = F.nll_loss(logp, _at(labels, keep), reduction="none")
    at = batch["teach"][:, 1:].to(keep.device) & keep if "teach" in batch else None  # (batch, seq_len - 1)
    if at is None or not bool(at.any()):
        if collective:  # every rank joins the teacher's all-gathers, taught tokens or not
            with torch.no_grad():
                target_logits(teacher, {"input_ids": batch["input_ids"][:1]}, torch.zeros_like(keep[:1]))
        return ce.sum(), keep.sum(), ce.new_zeros(())
    taught, rows = at[keep].nonzero().squeeze(1), at.any(dim=1)  # taught tokens' places among the kept
    with torch.no_grad():  # the teacher reads only the rows that hold replayed text, its head only their tokens
        rows_only = {k: v[rows] for k, v in batch.items() if not k.startswith(attention.PREFIX)}  # row-aligned ones
        want = F.log_softmax(target_logits(teacher, rows_only, at[rows]), dim=-1)  # row-major: logp[taught]'s order
    kl = F.kl_div(logp.index_select(0, taught), want, log_target=True, reduction="none").sum(-1)
    total = ce.sum() - weight * ce.index_select(0, taught).sum() + weight * kl.sum()
    return total, keep.sum(), kl.detach().sum()


def _targets(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels shifted to the positions that predict them, where they carry loss)."""
    labels = batch["labels"][:, 1:].to(batch["input_ids"].device)
    return labels, labels != IGNORE


def target_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor], keep: torch.Tensor) -> torch.Tensor:
    """float32 logits at the positions `keep` marks (of the shifted labels, (batch, seq_len - 1)),
    from the decoder and head alone where the model allows: the head and softmax run only where a
    loss is taken (SFT: the answers)."""
    # use_cache off: a cache would disable packed masks
    kwargs: dict[str, torch.Tensor | tuple[torch.Tensor, ...] | bool] = {"input_ids": batch["input_ids"], "use_cache": False}
    if "position_ids" in batch:
        if "attention_mask" in batch:
            raise ValueError("a packed batch must not carry an attention mask (it would hide the packing)")
        kwargs["position_ids"] = batch["position_ids"]
        if attention.uses_packed_attention(model):
            kwargs.update(attention.segment_kwargs(batch))  # one causal row per example
    elif "attention_mask" in batch:
        kwargs["attention_mask"] = batch["attention_mask"]
    body_head = _body_and_head(model)
    if body_head is None:
        logits: torch.Tensor = _at(model(**kwargs).logits, keep).float()
        return logits
    body, head = body_head
    hidden = body(**kwargs).last_hidden_state  # its last position predicts nothing: keep has one fewer
    selected: torch.Tensor = head(_at(hidden, keep)).float()
    return selected


def _at(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """values[:, :keep.shape[1]][keep] (row-major order), by index_select on the flattened first two
    dims (a view of a contiguous `values`: the full logits are never copied). Its backward is an
    index_add, where a boolean mask's is an accumulating index_put (~2 ms a step on CPU for
    forge-tiny's (4, 256, 128) hidden state)."""
    rows, cols = keep.nonzero(as_tuple=True)
    flat = values.reshape(values.shape[0] * values.shape[1], *values.shape[2:])
    return flat.index_select(0, rows * values.shape[1] + cols)


# causal LMs whose logits are exactly lm_head(last hidden state): no softcapping, scaling or router loss
_PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3", "olmo2", "smollm3", "gpt_neox"})


class _SplitModel(Protocol):
    """A transformers causal LM's parts (PEFT's model hands the calls on to the one it wraps)."""

    def get_decoder(self) -> torch.nn.Module | None: ...
    def get_output_embeddings(self) -> torch.nn.Module | None: ...


def _body_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, LM head) of a plain single-process causal LM (or a PEFT model of one), else None:
    a DDP or FSDP wrapper must run its own forward, and other heads may transform the logits."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEADS or not hasattr(model, "get_decoder"):
        return None
    if any(type(m).__name__.startswith("FSDP") for m in (model, *model.children())):
        return None
    plain = cast(_SplitModel, model)  # a transformers model of a plain type (checked above), or PEFT's around one
    try:
        body, head = plain.get_decoder(), plain.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return (body, head) if body is not None and head is not None else None


def policy_ratio_loss(logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
                      low: torch.Tensor | None = None, high: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token policy-gradient loss with importance weights r = exp(logp - old), the ratio of the
    policy to the policy that sampled: -min(r A, clip(r, low, high) A), PPO's clipped objective
    (Schulman et al. 2017); without bounds it is -r A (REINFORCE with importance sampling)."""
    ratio = torch.exp(logp - old)
    if low is None and high is None:
        return -ratio * advantages
    clipped = ratio.clamp(min=low, max=high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def masked_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean loss over the batch's labelled tokens (0, not NaN, when it has none)."""
    total, count = masked_lm_loss_sum(model, batch)
    return total / count.clamp(min=1)


def target_count(batch: torch.Tensor | dict[str, torch.Tensor]) -> int | torch.Tensor:
    """Target tokens in a batch: every position but the first of a block of token ids (an int, from
    its shape), or the labelled positions (after the first) of a dict batch with `labels`; a dict
    batch may name its own count under `targets` (its loss is then the mean over that many items).
    A dict batch's count is a 0-d tensor on the batch's device: counting reads nothing to the host."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] * (batch.shape[1] - 1)
    if "targets" in batch:  # a loss averaged over something else than tokens (DPO: pairs)
        targets: torch.Tensor = torch.as_tensor(batch["targets"])
        return targets
    labelled: torch.Tensor = (batch["labels"][:, 1:] != IGNORE).sum()
    return labelled
