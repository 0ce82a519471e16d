"""What the post-training stages (SFT, DPO, RFT) read: a source's chat records (its `chat:` spec,
with the stage's loss choice), the training or held-out split of its rows, and how the tokens
trained on are shared out over the sources, and the seeded order each epoch walks them in."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator, Literal

import torch

from forge.data.formats import FormatSpec, FormatStats
from forge.data.mixing import in_holdout
from forge.data.sources import Source
from forge.errors import ForgeError

LossOn = Literal["assistant", "all", "last_assistant"]  # FormatSpec.loss_on


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The random generator an epoch's shuffle draws from: the same order for a seed and epoch on
    every rank and after a resume."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def chat_spec(source: Source, where: str, loss_on: LossOn | None = None) -> FormatSpec:
    """The FormatSpec of a chat source (its `chat:` block), with the stage's loss choice."""
    spec: FormatSpec | None = getattr(source, "chat", None)
    if spec is None:
        raise ForgeError(f"{where}: data source {source.name!r} holds plain text; give it a chat: mapping "
                         "(kind: messages | instruction | prompt_completion | preference | hh)")
    return replace(spec, loss_on=loss_on) if loss_on else spec


def split_rows(source: Source, held_out: bool) -> Iterator[tuple[int, str, object]]:
    """The source's rows in the training split (or the held-out one): the same stable, hash-based
    split the pretraining stages use, so no stage evaluates on what another trained on."""
    for number, where, row in source.rows():
        if in_holdout(source.holdout_key, number, source.holdout) == held_out:
            yield number, where, row


def tokens_by_source(counts: dict[str, FormatStats], tokens: int, repeat: dict[str, int] | None = None) -> dict[str, int]:
    """The tokens trained on, split over the sources by their share of the encoded tokens (a
    source's counted `repeat` times an epoch where a stage repeats it)."""
    share = {n: c.tokens * (repeat or {}).get(n, 1) for n, c in counts.items()}
    total = max(1, sum(share.values()))
    return {n: round(tokens * v / total) for n, v in share.items()}
