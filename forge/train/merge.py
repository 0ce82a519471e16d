"""Weight averaging: checkpoint souping (a weighted mean of several checkpoints of one
architecture; Wortsman et al. 2022) and, with two ingredients, interpolation back toward a
stage's input weights (merge-back)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from forge.errors import ForgeError

_SAME = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "intermediate_size", "vocab_size")


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ForgeError(f"{folder}: no *.safetensors weights to average")
    return files


def _architecture(folder: Path) -> dict[str, object]:
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ForgeError(f"{folder}: cannot read config.json ({e})") from None
    return {k: config.get(k) for k in _SAME}


def average_weights(folders: list[Path], weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    """The weighted mean (weights normalised to sum 1; default uniform) of the checkpoints' tensors,
    computed in float64 and returned in each tensor's own dtype."""
    weights = weights or [1.0] * len(folders)
    total = float(sum(weights))
    first = _architecture(folders[0])
    for folder in folders[1:]:
        other = _architecture(folder)
        diff = {k: (first[k], other[k]) for k in _SAME if first[k] != other[k]}
        if diff:
            raise ForgeError(f"cannot average {folders[0]} and {folder}: architectures differ in "
                             + ", ".join(f"{k} ({a} vs {b})" for k, (a, b) in diff.items()))
    acc: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for n, (folder, w) in enumerate(zip(folders, weights)):
        seen = set()
        for file in _weight_files(folder):
            with safe_open(str(file), "pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    seen.add(key)
                    if n == 0:
                        acc[key], dtypes[key] = t.double() * (w / total), t.dtype
                    elif key not in acc:
                        raise ForgeError(f"cannot average: {folder} has tensor {key!r} that {folders[0]} lacks")
                    elif acc[key].shape != t.shape:
                        raise ForgeError(f"cannot average: tensor {key!r} is {tuple(t.shape)} in {folder} but "
                                         f"{tuple(acc[key].shape)} in {folders[0]}")
                    else:
                        acc[key] += t.double() * (w / total)
        missing = sorted(set(acc) - seen)
        if missing:
            raise ForgeError(f"cannot average: {folder} lacks tensors {missing[:5]}")
    return {k: v.to(dtypes[k]) for k, v in acc.items()}


def save_averaged(folders: list[Path], weights: list[float] | None, out: Path, extra: dict[str, str] | None = None) -> Path:
    """Average `folders` into a Hugging Face folder at `out` (config and tokenizer of the first),
    written atomically with the `extra` text files."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.files import atomic_dir

    state = average_weights(folders, weights)
    model = AutoModelForCausalLM.from_pretrained(folders[0], dtype=torch.float32, use_safetensors=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ForgeError(f"cannot average: tensors {unexpected[:5]} do not belong to {folders[0]}'s model")
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(folders[0]).save_pretrained(tmp)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
    return Path(out)


def merge_back(trained: Path, start: Path, weight: float, out: Path) -> Path:
    """Nova's merge-back: `weight * trained + (1 - weight) * start` as a Hugging Face folder at
    `out` (config and tokenizer of the trained checkpoint); kept if a resumed run already wrote it."""
    if not (Path(out) / "config.json").is_file():
        save_averaged([Path(trained), Path(start)], [weight, 1.0 - weight], out)
    return Path(out)
