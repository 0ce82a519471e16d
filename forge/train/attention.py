"""Attention over packed rows as one causal block per example.

transformers turns restarting position ids into a block-diagonal boolean mask (B, 1, L, L) and
hands it to SDPA: a mask turns off the causal fast path for the whole batch once any row holds two
examples, and a long row scores keys its examples never see. Here each example becomes a row of its own,
right-padded to the longest of its group (examples of like length): causal attention within that
row is exactly the block-diagonal mask (a padded key comes after every real query), so SDPA runs
with `is_causal=True` and no mask. transformers still builds its mask for the layers' call (one
per forward, unused here); on this project's CPUs the kernel's saving is about 5% of an SFT step at
forge-tiny's shape and none at head_dim 8 (bench_sft), where the masked kernel costs what the
causal one does.

The gather and scatter indices are made on the host with the batch (forge.data.packing.collate),
so the step reads nothing from the device. Registered with transformers' public AttentionInterface
under NAME; any call without the indices (evaluation, generation, a padded batch) is plain SDPA.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "forge_packed_sdpa"
_sdpa: Callable[..., tuple[torch.Tensor, None]] = sdpa_attention_forward  # transformers' own, any keyword
PREFIX = "segment_"  # the batch's index tensors (forge.data.packing.segments): segment_gather_<i>, segment_scatter


def segment_kwargs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | tuple[torch.Tensor, ...]]:
    """The model call's arguments for a packed batch's index tensors (none if it has none)."""
    gathers = [batch[k] for k in sorted((k for k in batch if k.startswith(PREFIX + "gather_")),
                                        key=lambda k: int(k.rsplit("_", 1)[1]))]
    return {"segment_gathers": tuple(gathers), "segment_scatter": batch[PREFIX + "scatter"]} if gathers else {}


AttentionInterface.register(NAME, lambda *a, **k: packed_sdpa(*a, **k))
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_packed_attention(model: PreTrainedModel) -> bool:
    """Switch a model on plain SDPA to NAME; False (unchanged) for any other attention, or a model
    that takes no registered attention function."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError):
        return False
    return uses_packed_attention(model)  # transformers may only warn and keep what it had


def uses_packed_attention(model: object) -> bool:
    """Whether `model` (or the module a DDP wrapper holds) attends through NAME."""
    config = getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)
    return getattr(config, "_attn_implementation", None) == NAME


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, **kwargs: object) -> tuple[torch.Tensor, None]:
    """SDPA over (batch, heads, seq, dim) tensors; given a packed batch's index tensors
    (`segment_gathers`, `segment_scatter`: segment_kwargs), one causal row per example, a call per
    group of examples of like length (forge.data.packing.segments)."""
    gathers, scatter = kwargs.pop("segment_gathers", ()), kwargs.pop("segment_scatter", None)
    b, heads, length, _ = query.shape
    if not (isinstance(gathers, tuple) and gathers and isinstance(scatter, torch.Tensor)) \
            or scatter.numel() != b * length or key.shape[2] != length \
            or kwargs.get("sliding_window") or kwargs.get("position_bias") is not None:  # not this batch's layout
        return _sdpa(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    flat = [x.transpose(1, 2).reshape(b * length, x.shape[1], x.shape[3]) for x in (query, key, value)]
    outs = []
    for gather in gathers:
        n, longest = gather.shape
        q, k, v = (x.index_select(0, gather.reshape(-1)).view(n, longest, *x.shape[1:]).transpose(1, 2) for x in flat)
        out, _ = _sdpa(module, q, k, v, None, is_causal=True, **kwargs)  # (n, longest, h, d)
        outs.append(out.reshape(n * longest, heads, -1))
    return torch.cat(outs).index_select(0, scatter).view(b, length, heads, -1), None
