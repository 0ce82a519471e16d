"""Packing whole SFT examples into fixed-length blocks, and the per-batch padding baseline.

Best-fit decreasing puts each example, longest first, into the open block with the least room that
still fits it. Position ids restart at 0 for every example, and packed batches carry no attention
mask: transformers then builds a block-diagonal causal mask from the restarting position ids
(`masking_utils.find_packed_sequence_indices`; flash-attention derives `cu_seqlens` from them the
same way), so attention stays inside each example and packed and unpacked training give the same
loss (forge.train.losses.masked_lm_loss: the token-level mean over labelled tokens). A batch also
carries the indices that lay it out as one row per example (`segments`), with which
forge.train.attention runs causal attention without that mask.
"""
from __future__ import annotations

import bisect
from itertools import islice
from typing import Iterable, Iterator

import torch

IGNORE = -100


def pad_token_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its end-of-sequence token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _check(examples: list[dict], seq_len: int) -> None:
    for i, ex in enumerate(examples):
        if not 0 < len(ex["input_ids"]) <= seq_len:
            raise ValueError(f"example {i} has {len(ex['input_ids'])} tokens; packing needs 1..{seq_len} "
                             "(apply the too_long policy first)")


def _block(members: list[dict], seq_len: int, pad_id: int) -> dict:
    ids, labels, pos, lengths = [], [], [], []
    for ex in members:
        n = len(ex["input_ids"])
        ids += ex["input_ids"]
        labels += [IGNORE] + list(ex["labels"][1:])  # an example's first token is never a target
        pos += range(n)
        lengths.append(n)
    pad = seq_len - len(ids)
    block = {"input_ids": ids + [pad_id] * pad, "labels": labels + [IGNORE] * pad,
             "position_ids": pos + list(range(pad)), "lengths": lengths,
             "records": [ex["record"] for ex in members if "record" in ex]}  # (source, record number), if known
    if any(ex.get("teach") for ex in members):  # tokens whose loss is distillation (losses.distilled_lm_loss_sum)
        block["teach"] = _teach(members, seq_len)
    return block


def _teach(members: list[dict], width: int) -> list[bool]:
    """Per token of the members laid end to end and padded to `width`: whether it is to be distilled."""
    out = [flag for ex in members for flag in [bool(ex.get("teach"))] * len(ex["input_ids"])]
    return out + [False] * (width - len(out))


def pack_best_fit(examples: list[dict], seq_len: int, pad_id: int) -> list[dict]:
    """Blocks of `seq_len` tokens: input_ids, labels, position_ids (restarting), lengths (real tokens),
    records (the examples' `record`, where they carry one)."""
    _check(examples, seq_len)
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]["input_ids"]))  # stable
    bins: list[list[dict]] = []
    room: list[tuple[int, int]] = []  # (free tokens, bin index), sorted; full bins leave the list
    for i in order:
        n = len(examples[i]["input_ids"])
        k = bisect.bisect_left(room, (n, -1))
        if k < len(room):
            free, b = room.pop(k)
        else:
            free, b = seq_len, len(bins)
            bins.append([])
        bins[b].append(examples[i])
        if free - n:
            bisect.insort(room, (free - n, b))
    return [_block(members, seq_len, pad_id) for members in bins]


def pack_next_fit(examples: list[dict], seq_len: int, pad_id: int) -> list[dict]:
    """Sequential packing in the given order (a new block whenever the next example does not fit)."""
    _check(examples, seq_len)
    bins: list[list[dict]] = []
    used = seq_len
    for ex in examples:
        n = len(ex["input_ids"])
        if used + n > seq_len:
            bins.append([])
            used = 0
        bins[-1].append(ex)
        used += n
    return [_block(members, seq_len, pad_id) for members in bins]


def pack_stream(examples: Iterable[dict], seq_len: int, pad_id: int, window: int = 1000) -> Iterator[dict]:
    """Best-fit decreasing over successive windows of `window` examples (memory stays bounded)."""
    it = iter(examples)
    while chunk := list(islice(it, window)):
        yield from pack_best_fit(chunk, seq_len, pad_id)


def packing_efficiency(blocks: list[dict]) -> float:
    """Real tokens / block tokens."""
    total = sum(len(b["input_ids"]) for b in blocks)
    return sum(sum(b["lengths"]) for b in blocks) / total if total else 0.0


def collate(blocks: list[dict]) -> dict[str, torch.Tensor]:
    """Packed blocks -> (batch, seq_len) tensors; no attention mask (see the module docstring); a
    boolean `teach` when some block has tokens to distil."""
    batch = {k: torch.tensor([b[k] for b in blocks], dtype=torch.long) for k in ("input_ids", "labels", "position_ids")}
    if any("teach" in b for b in blocks):
        batch["teach"] = torch.tensor([b.get("teach", [False] * len(b["input_ids"])) for b in blocks], dtype=torch.bool)
    gathers, batch["segment_scatter"] = segments(batch["position_ids"])
    batch.update({f"segment_gather_{i}": g for i, g in enumerate(gathers)})
    return batch


def segments(position_ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Index tensors that lay a packed (batch, seq_len) batch out as one row per example (an example
    starts where its position ids restart; a block's padding is an example of its own), in groups
    of examples whose lengths lie within a factor of two, each group right-padded to its longest
    (so padding at most doubles an example's length): `gathers`, per group (examples, longest),
    each example's token places in the flattened batch, its last place repeated as padding;
    `scatter` (batch x seq_len), each token's place in the groups' flattened layouts laid end to
    end. Made on the host with the batch, so the attention that uses them (forge.train.attention)
    reads nothing from the device."""
    rows, width = position_ids.shape
    flat = position_ids.reshape(-1)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1] + 1
    starts[::width] = True  # an example never spans two rows
    first = starts.nonzero().squeeze(1).tolist()
    lengths = [b - a for a, b in zip(first, first[1:] + [flat.numel()])]
    order = sorted(range(len(first)), key=lambda i: -lengths[i])
    gathers, scatter, offset, k = [], torch.empty(flat.numel(), dtype=torch.long), 0, 0
    while k < len(order):
        longest = lengths[order[k]]
        group = [i for i in order[k:] if 2 * lengths[i] > longest] or [order[k]]
        k += len(group)
        head = torch.tensor([first[i] for i in group])[:, None]
        size = torch.tensor([lengths[i] for i in group])[:, None]
        gathers.append(head + torch.minimum(torch.arange(longest)[None], size - 1))
        for row, i in enumerate(group):
            scatter[first[i]:first[i] + lengths[i]] = offset + row * longest + torch.arange(lengths[i])
        offset += len(group) * longest
    return gathers, scatter


def pad_batches(examples: list[dict], batch_size: int, pad_id: int) -> tuple[list[dict], float]:
    """Baseline: consecutive batches, each right-padded to its longest example; (batches, efficiency)."""
    batches, real, total = [], 0, 0
    for s in range(0, len(examples), batch_size):
        chunk = examples[s:s + batch_size]
        width = max(len(ex["input_ids"]) for ex in chunk)
        ids, labels, mask = [], [], []
        for ex in chunk:
            n, pad = len(ex["input_ids"]), width - len(ex["input_ids"])
            ids.append(list(ex["input_ids"]) + [pad_id] * pad)
            labels.append([IGNORE] + list(ex["labels"][1:]) + [IGNORE] * pad)
            mask.append([1] * n + [0] * pad)
            real += n
        total += width * len(chunk)
        batches.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
                        "attention_mask": torch.tensor(mask)})
        if any(ex.get("teach") for ex in chunk):
            batches[-1]["teach"] = torch.tensor([_teach([ex], width) for ex in chunk], dtype=torch.bool)
    return batches, (real / total if total else 0.0)
