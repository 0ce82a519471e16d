"""Checkpoints in Hugging Face format, written atomically (a crash never leaves half a folder),
plus what an exact resume needs: optimizer and scheduler state, RNG states, the data position."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pickle

import numpy as np
import torch

from forge.errors import ForgeError
from forge.files import atomic_dir

STATE = "forge_state.json"      # step, data loader position, stage result when final
TRAINING = "training_state.pt"  # optimizer, scheduler, RNG: intermediate checkpoints only
# What numpy's RNG state (a uint32 array) unpickles through; nothing else beyond torch's defaults.
_RNG_GLOBALS = [np.ndarray, np.dtype, np.dtypes.UInt32DType,
                getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct]


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


def training_state(optimizer, scheduler) -> dict:
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}}


def restore_training_state(path: Path, optimizer, scheduler) -> dict:
    """Load optimizer, scheduler and RNG states saved at `path`; return its forge_state.json."""
    file = Path(path) / TRAINING
    try:  # weights_only: a planted pickle payload is refused, never run; numpy's RNG state is allowed
        with torch.serialization.safe_globals(_RNG_GLOBALS):
            training = torch.load(file, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ForgeError(f"{file}: refused: it holds objects that are not allowed in a training state "
                         f"(loading is weights_only): {str(e).splitlines()[0][:200]}") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ForgeError(f"{file}: cannot read the training state: {str(e)[:200]}") from None
    optimizer.load_state_dict(training["optimizer"])
    scheduler.load_state_dict(training["scheduler"])
    torch.set_rng_state(training["rng"]["torch"])
    random.setstate(training["rng"]["python"])
    np.random.set_state(training["rng"]["numpy"])
    return json.loads((Path(path) / STATE).read_text())


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete resume point under `folder` (step-NNNNNNN folders), if any."""
    steps = sorted(p for p in Path(folder).glob("step-*") if (p / TRAINING).is_file() and (p / STATE).is_file())
    return steps[-1] if steps else None


def finished_result(final: Path) -> dict | None:
    """The saved result of a stage whose final checkpoint was written, else None."""
    state = Path(final) / STATE
    if not state.is_file():
        return None
    return json.loads(state.read_text()).get("result")
