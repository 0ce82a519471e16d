"""Training examples from rows: SFT conversations and preference pairs, rendered and tokenized a
chunk of rows at a time (see `forge.data.formats` for the row formats and the chat encoder), with
too-long sequences cut or dropped per `FormatSpec.too_long`.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any, Iterable, Iterator

from forge.data.formats import (
    IGNORE,
    ChatEncoder,
    FormatSpec,
    FormatStats,
    RecordError,
    fit_to_length,
    to_messages,
    to_preference,
)
from forge.errors import ForgeError


def _keep_reply(ids: list[int], labels: list[int], seq_len: int, stats: FormatStats) -> tuple[list[int], list[int]]:
    """A too-long preference sequence loses the start of its prompt (after the first token), not
    the end of its reply: the reply is what the pair compares (TRL's `keep_end`). A reply that
    alone overflows is left to the usual cut from the right."""
    cut = len(ids) - seq_len
    first = next((i for i, x in enumerate(labels) if x != IGNORE), len(ids))
    if cut <= 0 or first - cut < 1:
        return ids, labels
    stats.truncated += 1
    return ids[:1] + ids[1 + cut:], labels[:1] + labels[1 + cut:]


def _pair_limit(spec: FormatSpec, seq_len: int) -> int | None:
    """How many tokens of a pair's sequence to encode: all of them when a long one keeps its reply's
    end (`too_long: truncate`), else just enough to tell that it overflows."""
    return None if spec.too_long == "truncate" else seq_len + 1


def _pair(encoded: list[tuple[list[int], list[int]]], spec: FormatSpec, seq_len: int, stats: FormatStats):
    out = {}
    for name, (ids, labels) in zip(("chosen", "rejected"), encoded):
        if spec.too_long == "truncate":
            ids, labels = _keep_reply(ids, labels, seq_len, stats)
        ex = fit_to_length(ids, labels, seq_len, spec.too_long, stats)
        if ex is None:
            return None
        out[f"{name}_input_ids"], out[f"{name}_labels"] = ex["input_ids"], ex["labels"]
    return out


# ------------------------------------------------------------------------------------ streaming
@dataclass(frozen=True)
class OnError:
    """What a bad record does: `fail` the read, or `skip` it, counted (more than max_errors still fail)."""

    action: str = "fail"
    max_errors: int = 100


CHUNK = 64  # rows rendered, then tokenized in one batch


def _records(rows: Iterable[tuple[int, str, Any]], source_name: str, stats: FormatStats, steps: tuple,
             encoder: ChatEncoder, limit: int | None, on_error: OnError):
    """Rows -> examples, CHUNK rows at a time: each row's conversations rendered (`steps[0]`: a bad
    record raises or is counted), then all of them tokenized in one batch, then finished in order
    (`steps[1]`)."""
    prepare, finish = steps
    max_errors = on_error.max_errors
    rows = iter(rows)
    while batch := list(islice(rows, CHUNK)):
        ready = []
        for record, where, row in batch:
            stats.records += 1
            try:
                ready.append((record, prepare(row, where)))
            except RecordError as e:
                if on_error.action == "fail":
                    raise
                stats.skipped_errors += 1
                if len(stats.errors) < 5:
                    stats.errors.append(str(e))
                if stats.skipped_errors > max_errors:
                    raise ForgeError(f"data source {source_name!r}: more than {max_errors} bad records "
                                     f"(on_error: skip, max_errors: {max_errors}); first: {stats.errors[0]}; "
                                     f"last: {e}") from None
        encoded = iter(encoder.encode_prepared([p for _, items in ready for p in items], limit))
        for record, items in ready:
            ex = finish([next(encoded) for _ in items])
            if ex is not None:
                stats.examples += 1
                stats.kept.append(record)
                yield ex


def sft_examples(rows: Iterable[tuple[int, str, Any]], tokenizer, spec: FormatSpec, seq_len: int,
                 source_name: str, stats: FormatStats, on_error: OnError = OnError()) -> Iterator[dict]:
    """Stream {'input_ids', 'labels'} from (record number, 'file:line N', row) triples. A bad record
    raises, or with on_error skip is counted."""
    enc = ChatEncoder(tokenizer, spec)
    steps = (lambda row, where: [enc.prepare(to_messages(row, spec, where), where)],
             lambda done: fit_to_length(*done[0], seq_len, spec.too_long, stats))
    return _records(rows, source_name, stats, steps, enc, seq_len + 1, on_error)


def preference_examples(rows: Iterable[tuple[int, str, Any]], tokenizer, spec: FormatSpec, seq_len: int,
                        source_name: str, stats: FormatStats, on_error: OnError = OnError()) -> Iterator[dict]:
    """Stream tokenized preference pairs: chosen_/rejected_ input_ids and labels (labels on the reply
    only); a pair either of whose sequences is dropped is left out."""
    enc = ChatEncoder(tokenizer, spec)

    def prepare(row, where):
        prompt, chosen, rejected = to_preference(row, spec, where)
        return [enc.prepare(prompt + reply, where, len(prompt)) for reply in (chosen, rejected)]

    return _records(rows, source_name, stats, (prepare, lambda done: _pair(done, spec, seq_len, stats)), enc,
                    _pair_limit(spec, seq_len), on_error)
