"""A stage kind's part of training, as the loop (forge.train.loop.fit) takes it: a small `Task`
subclass that makes the kind's micro-batches and its loss, and adds what is its own (evaluation,
samples, log figures, final figures). Everything else, the loop and its hooks do alike for every kind."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Generic, Mapping

import torch

from forge.data.sources import Source
from forge.train.losses import Loss
from forge.train.state import Resumable, TrainState
from forge.train.step import B, Record, StepResult


@dataclass
class Outcome:
    """What a kind adds at the end: its own final metrics, tokens per source, lineage and tags."""

    metrics: dict[str, float] = field(default_factory=dict)
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    lineage: Mapping[str, object] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


class Task(ABC, Generic[B]):
    """A stage kind's part of training, over micro-batches of type B (a tensor of token ids, or a
    dict of named tensors). A kind implements the four abstract methods; the rest do nothing unless
    it overrides them.

    `data` is its data stream (its position is part of the resume state) and `sources` its data
    sources by name, so that the divergence guard names a bad step's records `source file:line`."""

    evaluates: bool = False           # `evaluate` gives held-out figures (else it is never called)
    samples_every: int = 0            # steps between `samples` calls (the kind's samples: block; 0: none)
    chat_template: str | None = None  # saved with the tokenizer (post-training)
    postfix: str = ""                 # the progress bar's extra figure, a key of the log row

    def __init__(self, data: Resumable, sources: dict[str, Source] | None = None) -> None:
        self.data = data
        self.sources: dict[str, Source] = sources if sources is not None else {}

    @abstractmethod
    def batches(self) -> list[B]:
        """This rank's micro-batches of the next step."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: B) -> torch.Tensor | Loss:
        """A micro-batch's mean loss, or a Loss with the kind's statistics of it."""

    @abstractmethod
    def tokens(self, batches: list[B]) -> int:
        """The real tokens of a step's micro-batches on this rank."""

    @abstractmethod
    def finish(self, state: TrainState) -> Outcome:
        """The kind's final figures, once the last step is done."""

    def records(self) -> list[Record]:
        """The (source, record number) of the records in the micro-batches handed out since the last
        call (this rank's; the loop asks after each `batches()`)."""
        return []

    def before_step(self, step: int) -> None:
        """Work ahead of a step, not timed as training (RFT's rollouts)."""

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out figures (the loop logs them), where `evaluates`."""
        return {}

    def samples(self, step: int) -> None:
        """Log sample generations (every `samples_every` steps)."""

    def row(self, out: StepResult) -> dict[str, float]:
        """The kind's own figures of a log line (called on every rank, at the log interval only)."""
        return {}
