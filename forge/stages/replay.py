"""Plain-text replay inside a post-training stage: an SFT stage's plain-text sources (a data source
without `chat:`, e.g. the foundation's curated general text) become language-modelling examples
(loss on every token) packed with the chat examples, so the stage learns its chat data while
rehearsing general text in the same steps (replay against forgetting; mixed training of knowledge
text and questions: Allen-Zhu & Li, Physics of Language Models 3.1)."""
from __future__ import annotations

from typing import Any, Iterator

from forge.data.formats import IGNORE, FormatStats
from forge.data.mixing import in_holdout
from forge.data.sources import Source


def text_examples(source: Source, tokenizer: Any, seq_len: int, held_out: bool,
                  stats: FormatStats) -> Iterator[dict[str, Any]]:
    """{'input_ids', 'labels'} from the source's documents in one split (the stable hashed split the
    pretraining stages use): each document after the end-of-text separator, as pretraining packs
    it, cut into pieces of at most seq_len tokens; every token but the separator carries loss."""
    eos = tokenizer.eos_token_id
    for number, text in source.records():
        if in_holdout(source.holdout_key, number, source.holdout) != held_out:
            continue
        stats.records += 1
        ids = ([eos] if eos is not None else []) + tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), seq_len):
            piece = ids[start:start + seq_len]
            if len(piece) < 2:
                continue
            labels = list(piece)
            if start == 0 and eos is not None:
                labels[0] = IGNORE  # the separator is context, not a token to learn
            stats.examples += 1
            stats.tokens += len(piece)
            stats.label_tokens += sum(t != IGNORE for t in labels)
            yield {"input_ids": piece, "labels": labels, "record": (source.name, number)}
