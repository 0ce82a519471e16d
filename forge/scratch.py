"""A foundation made offline: a tiny Llama-style model from a config plus a BPE tokenizer.

Used by recipes whose `base` is `scratch:` (the quickstart, tests), so the whole pipeline runs
with nothing downloaded. The result is an ordinary Hugging Face checkpoint folder.
"""
from __future__ import annotations

import hashlib
import json
from itertools import islice
from pathlib import Path

import torch

from forge.data.sources import Source
from forge.files import atomic_dir
from forge.recipe import ScratchBase

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def train_tokenizer(sources: list[Source], vocab_size: int, max_docs: int = 20_000):
    """Byte-level BPE trained on up to `max_docs` documents per source, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = (text for src in sources for _, text in islice(src.records(), max_docs))
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=1 << 20,
    )


def scratch_key(cfg: ScratchBase, fingerprints: list[str]) -> str:
    """A short hash of the base's settings and its tokenizer data: a changed recipe gets a new base."""
    blob = json.dumps({"cfg": cfg.model_dump(mode="json"), "data": fingerprints}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_scratch_base(cfg: ScratchBase, sources: list[Source], out: Path) -> Path:
    """Write a randomly initialised model and its tokenizer to `out` (atomically; reused if present,
    so name `out` after everything that shapes it: see `scratch_key`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    tokenizer = train_tokenizer(sources, cfg.vocab_size)
    hf = cfg.hf_config()
    hf.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    hf.pop("architectures"), hf.pop("model_type")
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(LlamaConfig(**hf))
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out
