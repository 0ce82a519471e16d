"""Causal attention for training: packed rows as one causal row per example, and on a CPU in
blocks of queries.

transformers turns restarting position ids into a block-diagonal boolean mask (B, 1, L, L) and
hands it to SDPA: a mask turns off the causal fast path for the whole batch once any row holds two
examples, and a long row scores keys its examples never see. Here each example becomes a row of its own,
right-padded to the longest of its group (examples of like length): causal attention within that
row is exactly the block-diagonal mask (a padded key comes after every real query), so SDPA runs
causal with no mask. transformers still builds its mask for the layers' call (one per forward,
unused here).

On a CPU, PyTorch's flash kernel takes up to 512 keys as one block and computes the masked half of
a causal row anyway; so a causal call over 2 blocks to 512 tokens runs one query block at a time,
each against the keys up to its end (forward and backward of 512-token rows take a sixth less
time at head_dim 32 to 128 and up to half less at head_dim 8; 256-token rows gain less:
bench/bench_attention.py). Past 512 tokens the kernel splits
the keys itself and skips what the mask hides; a GPU's kernels always do.

The gather and scatter indices are made on the host with the batch (forge.data.packing.collate),
so the step reads nothing from the device. Registered with transformers' public AttentionInterface
under NAME; a call with a mask (padded rows), with queries and keys of other lengths (decoding from a
cache), non-causal, with a sliding window or a position bias is transformers' plain SDPA.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "forge_packed_sdpa"
_sdpa: Callable[..., tuple[torch.Tensor, None]] = sdpa_attention_forward  # transformers' own, any keyword
CPU_LONGEST = 512  # past it the CPU kernel splits the keys and skips the masked ones itself
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
    group of examples of like length (forge.data.packing.segments); causal_sdpa for a causal call
    with no mask; transformers' SDPA for any other."""
    gathers, scatter = kwargs.pop("segment_gathers", ()), kwargs.pop("segment_scatter", None)
    flag = kwargs.pop("is_causal", None)
    b, heads, length, _ = query.shape
    plain = kwargs.get("sliding_window") or kwargs.get("position_bias") is not None or key.shape[2] != length
    if plain or not (isinstance(gathers, tuple) and gathers and isinstance(scatter, torch.Tensor)) \
            or scatter.numel() != b * length:  # not this batch's layout
        causal = flag if flag is not None else getattr(module, "is_causal", True)  # as transformers' SDPA reads it
        if causal and attention_mask is None and not plain and length > 1:
            return causal_sdpa(module, query, key, value, **kwargs)
        return _sdpa(module, query, key, value, attention_mask, is_causal=flag, **kwargs)
    flat = [x.transpose(1, 2).reshape(b * length, x.shape[1], x.shape[3]) for x in (query, key, value)]
    outs = []
    for gather in gathers:
        n, longest = gather.shape
        q, k, v = (x.index_select(0, gather.reshape(-1)).view(n, longest, *x.shape[1:]).transpose(1, 2) for x in flat)
        out, _ = causal_sdpa(module, q, k, v, **kwargs)  # (n, longest, h, d)
        outs.append(out.reshape(n * longest, heads, -1))
    return torch.cat(outs).index_select(0, scatter).view(b, length, heads, -1), None


def causal_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                **kwargs: object) -> tuple[torch.Tensor, None]:
    """Causal SDPA over (batch, heads, seq, dim), queries and keys of one length; on a CPU, for 2
    blocks to CPU_LONGEST tokens, one block of queries at a time against the keys up to its end
    (the module docstring says why): (batch, seq, heads, dim), as transformers' SDPA returns."""
    length, size = query.shape[2], 64 if query.shape[3] <= 16 else 128
    if query.device.type != "cpu" or not 2 * size <= length <= CPU_LONGEST:
        return _sdpa(module, query, key, value, None, is_causal=True, **kwargs)
    outs = [_sdpa(module, query[:, :, start:end], key[:, :, :end], value[:, :, :end], mask, is_causal=False,
                  **kwargs)[0] for start, end, mask in query_blocks(length, size, query.dtype)]
    return torch.cat(outs, dim=1), None


@lru_cache(maxsize=64)
def query_blocks(length: int, size: int, dtype: torch.dtype = torch.float32) -> tuple[tuple[int, int, torch.Tensor], ...]:
    """(start, end, additive mask (end - start, end) of `dtype` on the CPU) per block of `size`
    queries, a tail shorter than half a block joined to the block before it (a one-query block
    would send transformers' SDPA down its decoding path): query start + r sees keys 0..start + r.
    Made as ordinary tensors even under inference_mode, since a training step may reuse them."""
    starts = list(range(0, length, size))
    if len(starts) > 1 and length - starts[-1] < size // 2:
        starts.pop()
    blocks = []
    with torch.inference_mode(False):
        for start, end in zip(starts, starts[1:] + [length]):
            seen = torch.ones(end - start, end, dtype=torch.bool, device="cpu").tril(start)
            mask = torch.zeros(seen.shape, dtype=dtype, device="cpu").masked_fill_(~seen, float("-inf"))
            blocks.append((start, end, mask))
    return tuple(blocks)
