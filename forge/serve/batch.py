"""From the SDK's datums to a training batch.

A Datum is a token sequence (`model_input`) with per-position loss inputs: `target_tokens[i]` is
the token position i should predict, and the loss function's own inputs (forge.serve.losses):
`weights[i]` for cross_entropy (0 on prompts), the sampler's `logprobs[i]` and `advantages[i]` for
the policy losses. Every loss is a sum over every position of every datum (not a mean: the SDK's
custom losses rely on it, sending `weights = -dC/dlogprobs`); a client wanting forge's per-token
mean sends weights that sum to 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from forge.serve import proto
from forge.serve.losses import LossFn
from forge.serve.wire import Refused
from forge.train.losses import target_logits

TOKENS = (proto.INT64, proto.INT32)
FLOATS = (proto.FLOAT32,)


@dataclass(frozen=True)
class Example:
    tokens: np.ndarray   # int64 (T,): the model's input
    targets: np.ndarray  # int64 (T,): the token each position predicts
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # float32 (T,): the loss's inputs by name


@dataclass(frozen=True)
class Limits:
    """What a model accepts: token ids below `vocab`, at most `context` positions (None: no limit known)."""

    vocab: int
    context: int | None


def _tensor(t: Any, where: str, length: int, dtypes: tuple[int, ...]) -> np.ndarray:
    if t.HasField("sparse_csr"):
        raise Refused(f"{where}: a sparse tensor is not served (send it dense)")
    if t.dtype not in dtypes:
        names = " or ".join(proto.DTYPES[d].removeprefix("DTYPE_").lower() for d in dtypes)
        raise Refused(f"{where}: expected {names}, got {proto.DTYPES[t.dtype] if t.dtype < len(proto.DTYPES) else t.dtype}")
    np_type = {proto.FLOAT32: np.float32, proto.INT64: np.int64, proto.INT32: np.int32}[t.dtype]
    if len(t.dense) % np.dtype(np_type).itemsize:
        raise Refused(f"{where}: {len(t.dense)} bytes is not a whole number of {np.dtype(np_type).name} values")
    values = np.frombuffer(t.dense, dtype=np_type)
    if list(t.shape) not in ([], [len(values)]) or len(values) != length:
        raise Refused(f"{where}: expected one value per input token ({length}), got shape "
                      f"{list(t.shape) or [len(values)]}")
    return values


def _tokens(datum: Any, where: str) -> np.ndarray:
    parts = []
    for j, chunk in enumerate(datum.model_input):
        if chunk.HasField("image") or chunk.HasField("dmel"):
            kind = "image" if chunk.HasField("image") else "audio (dmel)"
            raise Refused(f"{where}.model_input.chunks[{j}]: {kind} chunks are not served; send encoded text")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def examples(msg: Any, limits: Limits, fn: LossFn, config: dict[str, float]) -> list[Example]:
    """The request's datums, checked: tokens within the vocabulary and the context, one target and
    one finite value of each of the loss's inputs per position (an optional input absent from a
    datum takes the request's loss_fn_config value, else the loss's default)."""
    if not msg.data:
        raise Refused("forward_backward: data is empty; send at least one Datum")
    out = []
    for i, datum in enumerate(msg.data):
        where = f"data[{i}]"
        tokens = _tokens(datum, where)
        if not len(tokens):
            raise Refused(f"{where}.model_input: no tokens")
        if limits.context is not None and len(tokens) > limits.context:
            raise Refused(f"{where}.model_input: {len(tokens)} tokens exceed the model's context of {limits.context}")
        given = dict(datum.loss_fn_inputs)
        missing = [n for n in ("target_tokens", *fn.required) if n not in given]
        unknown = sorted(set(given) - {"target_tokens", *fn.inputs})
        if missing or unknown:
            optional = f" (and optionally {', '.join(fn.optional)})" if fn.optional else ""
            raise Refused(f"{where}.loss_fn_inputs: {fn.name} takes {', '.join(('target_tokens', *fn.required))}"
                          f"{optional}; got {sorted(given)}")
        targets = _tensor(given["target_tokens"], f"{where}.loss_fn_inputs.target_tokens", len(tokens),
                          TOKENS).astype(np.int64)
        for name, ids in (("model_input", tokens), ("loss_fn_inputs.target_tokens", targets)):
            if ids.min() < 0 or ids.max() >= limits.vocab:
                raise Refused(f"{where}.{name}: token ids must be in [0, {limits.vocab}); got {int(ids.min())}.."
                              f"{int(ids.max())}")
        inputs = {}
        for name in fn.inputs:
            if name in given:
                values = _tensor(given[name], f"{where}.loss_fn_inputs.{name}", len(tokens), FLOATS)
            else:
                values = np.full(len(tokens), config.get(name, fn.optional.get(name, 0.0)), dtype=np.float32)
            if not np.isfinite(values).all():
                raise Refused(f"{where}.loss_fn_inputs.{name}: every value must be finite")
            inputs[name] = values.astype(np.float32)
        out.append(Example(tokens, targets, inputs))
    return out


def collate(items: list[Example], pad_id: int, fn: LossFn) -> dict[str, torch.Tensor]:
    """Right-padded (batch, longest) tensors: input_ids, attention_mask, target_tokens and the loss's
    inputs (0 on padding)."""
    width = max(len(e.tokens) for e in items)

    def padded(arrays: list[np.ndarray], fill: float, dtype: torch.dtype) -> torch.Tensor:
        rows = [np.pad(a, (0, width - len(a)), constant_values=fill) for a in arrays]
        return torch.as_tensor(np.stack(rows), dtype=dtype)

    batch = {"input_ids": padded([e.tokens for e in items], pad_id, torch.long),
             "attention_mask": padded([np.ones(len(e.tokens)) for e in items], 0, torch.long),
             "target_tokens": padded([e.targets for e in items], 0, torch.long)}
    for name in fn.inputs:
        batch[name] = padded([e.inputs[name] for e in items], 0.0, torch.float32)
    return batch


def token_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(target_tokens) at every position, (batch, width), 0 on padding: the float32 logits of
    forge's own losses (forge.train.losses.target_logits, only where a token is), then log-softmax."""
    keep = batch["attention_mask"].bool()
    logits = target_logits(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, keep)
    picked = F.log_softmax(logits, dim=-1).gather(1, batch["target_tokens"][keep].unsqueeze(1)).squeeze(1)
    return torch.zeros(keep.shape, dtype=picked.dtype, device=picked.device).index_put((keep,), picked)


def per_datum(values: torch.Tensor, items: list[Example]) -> list[np.ndarray]:
    """(batch, width) -> each datum's own positions, as float32 arrays."""
    rows = values.detach().float().cpu().numpy()
    return [rows[i, :len(e.tokens)].copy() for i, e in enumerate(items)]
