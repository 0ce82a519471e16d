"""config.json against the tensors in the safetensors shards, before an export writes anything.

A config can claim anything (10^12 layers, a hidden size of 0, a null vocabulary); the shard
headers cannot: the layer count comes from the tensor names, the hidden size and vocabulary from
the embedding's shape, the heads from the q/k/v projections (with the config's head_dim, or
hidden_size / num_attention_heads), the MLP width and expert count from the MLP's tensors. Each
size the config gives must be a positive whole number equal to what the weights say, else one line
names the key, its value and what the weights say. Keys without evidence in the tensors are left
to the runtime; `declared_parameters` counts what the config would build (for `--verify`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from forge.errors import ForgeError

Specs = dict[str, tuple[Any, tuple[int, ...]]]  # tensor name -> (dtype, shape), from the headers

# (config key, a tensor-name pattern whose group 1 is the layer index)
LAYERS = [("num_hidden_layers", r"(?:^|\.)layers\.(\d+)\."), ("n_layer", r"(?:^|\.)h\.(\d+)\."),
          ("num_layers", r"(?:^|\.)encoder\.block\.(\d+)\."), ("num_decoder_layers", r"(?:^|\.)decoder\.block\.(\d+)\.")]
EMBEDDING = re.compile(r"(?:^|\.)(?:embed_tokens|wte|shared)\.weight")
HIDDEN = ("hidden_size", "n_embd", "d_model")
FALLBACK = {"num_decoder_layers": "num_layers", "num_key_value_heads": "num_attention_heads"}  # null means "same as"


def check_config(config: Any, specs: Specs, where: Path) -> None:
    """Raise a ForgeError naming the first size in `config` that the tensors contradict."""
    if not isinstance(config, dict):
        raise ForgeError(f"{where}: expected a JSON object, got {type(config).__name__}")
    c = _Checker(config, where)
    for key, pattern in LAYERS:
        found = {int(m.group(1)) for n in specs if (m := re.search(pattern, n))}
        if found:
            c.equal(key, max(found) + 1, f"tensors for layers 0-{max(found)}")
    embedding = next((n for n in specs if EMBEDDING.search(n) and len(specs[n][1]) == 2), None)
    if embedding:
        rows, cols = specs[embedding][1]
        c.equal("vocab_size", rows, f"{embedding} has {rows} rows")
        for key in HIDDEN:
            c.equal(key, cols, f"{embedding} has {cols} columns")
    _check_attention(c, specs)
    _check_mlp(c, specs)


class _Checker:
    def __init__(self, config: dict, where: Path) -> None:
        self.config, self.where = config, where

    def value(self, key: str, why: int | str | None = None) -> int:
        """The config's positive whole `key` (or what a null falls back to); else the one line."""
        v = self.config.get(key)
        if v is None and key in FALLBACK:
            return self.value(FALLBACK[key], why)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            said = f" (the weights say {why})" if why is not None else ""
            raise ForgeError(f"{self.where}: {key} is {json.dumps(v)}: expected a positive whole number{said}")
        return v

    def equal(self, key: str, want: int, evidence: str) -> None:
        if key not in self.config:
            return
        if self.value(key, want) != want:
            self.wrong(key, want, evidence)

    def wrong(self, key: str, want: int | str, evidence: str) -> None:
        raise ForgeError(f"{self.where}: {key} is {json.dumps(self.config.get(key))}, but the weights say {want} "
                         f"({evidence})")


def _rows(specs: Specs, pattern: str) -> tuple[str, int] | None:
    name = next((n for n in specs if re.search(pattern, n)), None)
    return (name, specs[name][1][0]) if name and specs[name][1] else None


def _check_attention(c: _Checker, specs: Specs) -> None:
    """heads x head_dim must be q_proj's rows and kv heads x head_dim k_proj's (and v_proj's); when
    they are not, the one key whose change makes both hold is named, with the value that would."""
    q = _rows(specs, r"\.q_proj\.weight$")
    if q is None or "num_attention_heads" not in c.config or "hidden_size" not in c.config:
        return
    hidden, heads = c.value("hidden_size"), c.value("num_attention_heads")
    explicit = c.config.get("head_dim") is not None
    if not explicit and hidden % heads:
        raise ForgeError(f"{c.where}: num_attention_heads is {heads}: hidden_size {hidden} is not a multiple of it "
                         f"(and config.json gives no head_dim; {q[0]} has {q[1]} rows)")
    head_dim = c.value("head_dim") if explicit else hidden // heads
    k = _rows(specs, r"\.k_proj\.weight$") or q
    kv = c.value("num_key_value_heads", k[1] // head_dim if k[1] % head_dim == 0 else None)
    v = _rows(specs, r"\.v_proj\.weight$")
    if v is not None and v[1] != k[1]:
        raise ForgeError(f"{c.where}: the weights disagree with themselves: {k[0]} has {k[1]} rows, {v[0]} {v[1]}")
    if heads * head_dim == q[1] and kv * head_dim == k[1]:
        return
    shown = f"{q[0]} has {q[1]} rows, {k[0]} {k[1]}"
    fits = []  # each key that alone, changed to the value given, makes both hold
    if explicit and q[1] % heads == 0 and kv * (q[1] // heads) == k[1]:
        fits.append(("head_dim", q[1] // heads))
    if explicit and q[1] % head_dim == 0 and kv * head_dim == k[1]:
        fits.append(("num_attention_heads", q[1] // head_dim))
    if not explicit and q[1] == hidden and (kv * hidden) % k[1] == 0 and hidden % (kv * hidden // k[1]) == 0:
        fits.append(("num_attention_heads", kv * hidden // k[1]))  # head_dim follows the heads
    if heads * head_dim == q[1] and k[1] % head_dim == 0:
        fits.append(("num_key_value_heads" if "num_key_value_heads" in c.config else "num_attention_heads",
                     k[1] // head_dim))
    if len(fits) == 1:
        c.wrong(*fits[0], shown)
    stated = ", ".join(f"{key} is {json.dumps(c.config.get(key))}" for key in dict.fromkeys(
        ["num_attention_heads", "num_key_value_heads", *(["head_dim"] if explicit else [])]))
    say = " or ".join(f"{key} {want}" for key, want in fits) if fits else "none of these"
    raise ForgeError(f"{c.where}: {stated}: the weights say {say} ({shown})")


def _check_mlp(c: _Checker, specs: Specs) -> None:
    fused = next((n for n in specs if n.endswith("experts.gate_up_proj") and len(specs[n][1]) == 3), None)
    experts = {int(m.group(1)) for n in specs if (m := re.search(r"\.experts\.(\d+)\.", n))}
    if experts:
        c.equal("num_local_experts", max(experts) + 1, f"tensors for experts 0-{max(experts)}")
    elif fused:
        c.equal("num_local_experts", specs[fused][1][0], f"{fused} has shape {list(specs[fused][1])}")
    width = _rows(specs, r"\.mlp\.(?:gate_proj|up_proj)\.weight$") or _rows(specs, r"\.experts\.\d+\.w1\.weight$")
    if width:
        c.equal("intermediate_size", width[1], f"{width[0]} has {width[1]} rows")
    elif fused:
        c.equal("intermediate_size", specs[fused][1][1] // 2, f"{fused} has shape {list(specs[fused][1])}")


def declared_parameters(folder: Path) -> int:
    """How many parameters the config in `folder` declares: the model built on the meta device
    (no memory), each shared (tied) tensor counted once."""
    import torch
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    auto = transformers.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) \
        else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())
