"""Checkpoints in Hugging Face format, written atomically (a crash never leaves half a folder),
plus what an exact resume needs: optimizer and scheduler state, RNG states, the data position.

A checkpoint folder holds the model (safetensors), the tokenizer, `forge_state.json` (step,
tokens, metrics, data position; a final checkpoint also its stage result) and `training_state.pt`
(optimizer, scheduler, RNG), read back with `weights_only=True`: no pickled code is ever loaded.
"""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch

from forge.errors import ForgeError
from forge.files import atomic_dir

STATE = "forge_state.json"      # step, tokens, metrics, data position; the stage result when final
TRAINING = "training_state.pt"  # optimizer, scheduler, RNG
_TENSOR_PARTS = ("optimizer", "scheduler", "rng")
_STEP = re.compile(r"step-(\d+)")


def save_checkpoint(model, tokenizer, path: Path, state: dict | None = None, training: dict | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer + `forge_state.json` (+ `training_state.pt`)."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if state is not None:
            (tmp / STATE).write_text(json.dumps(state, indent=2))
        if training is not None:
            torch.save(training, tmp / TRAINING)
    return Path(path)


def split_state(state: dict) -> tuple[dict, dict]:
    """A TrainState's state_dict as (JSON part, tensor part)."""
    return ({k: v for k, v in state.items() if k not in _TENSOR_PARTS},
            {k: v for k, v in state.items() if k in _TENSOR_PARTS})


def _load_training(file: Path) -> dict:
    """training_state.pt, weights_only: a planted pickle payload is refused, never run (RNG states
    are saved as tensors and plain types, so nothing beyond torch's safe defaults is needed)."""
    try:
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ForgeError(f"{file}: refused: it holds objects that are not allowed in a training state "
                         f"(loading is weights_only): {str(e).splitlines()[0][:200]}") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ForgeError(f"{file}: cannot read the training state: {str(e)[:200]}") from None


def load_state(path: Path) -> dict:
    """The whole saved TrainState of a checkpoint folder (both files)."""
    state = json.loads((Path(path) / STATE).read_text())
    state.update(_load_training(Path(path) / TRAINING))
    return state


def load_optimizer_state(path: Path) -> dict | None:
    """The optimizer moments a checkpoint kept (for optim.carry_over), or None."""
    file = Path(path) / TRAINING
    return _load_training(file).get("optimizer") if file.is_file() else None


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete resume point under `folder`: `step-NNNNNNN` folders only (never a
    `.partial` or `.old` one a crash left behind)."""
    steps = [p for p in Path(folder).glob("step-*")
             if _STEP.fullmatch(p.name) and (p / TRAINING).is_file() and (p / STATE).is_file()]
    return max(steps, key=lambda p: int(_STEP.fullmatch(p.name).group(1))) if steps else None


def finished_result(final: Path) -> dict | None:
    """The saved result of a stage whose final checkpoint was written, else None."""
    state = Path(final) / STATE
    if not state.is_file():
        return None
    return json.loads(state.read_text()).get("result")
