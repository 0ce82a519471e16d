"""The checkpoint folder format, which forge.train.checkpointer's FullCheckpointer writes and reads:
Hugging Face weights, written atomically (a crash never leaves half a folder), plus what an exact
resume needs: optimizer and scheduler state, RNG states, the data position.

A checkpoint folder holds the model (safetensors), the tokenizer, `forge_state.json` (step,
tokens, metrics, data position, the run identity; a final checkpoint also its stage result),
`training_state.pt` (optimizer, scheduler, RNG), read back with `weights_only=True` (no pickled
code is ever loaded), and `manifest.json`: the sha256 of every other file, checked before a
checkpoint is used, so a damaged one is skipped for the one before it.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeAlias

import torch
from torch.optim.optimizer import StateDict

from forge.errors import ForgeError
from forge.files import atomic_dir
from forge.scrub import first_line

if TYPE_CHECKING:  # the libraries load with a checkpoint, not with the module
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HfModel: TypeAlias = "PreTrainedModel | PeftModel"  # a model that writes itself as a Hugging Face folder

STATE = "forge_state.json"      # step, tokens, metrics, data position; the stage result when final
TRAINING = "training_state.pt"  # optimizer, scheduler, RNG
MANIFEST = "manifest.json"      # {relative file name: sha256} of everything else in the folder
_TENSOR_PARTS = ("optimizer", "scheduler", "rng")
_STEP = re.compile(r"step-(\d+)")


def save_checkpoint(model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict | None = None,
                    training: StateDict | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer + `forge_state.json` (+ `training_state.pt`) +
    the manifest. A failed write (disk full, read-only folder; an OSError, or safetensors' own
    SafetensorError) leaves the previous checkpoints as they were and says so in a forge error."""
    from safetensors import SafetensorError

    try:
        with atomic_dir(path) as tmp:
            model.save_pretrained(str(tmp), safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            if state is not None:
                (tmp / STATE).write_text(json.dumps(state, indent=2))
            if training is not None:
                torch.save(training, tmp / TRAINING)
            (tmp / MANIFEST).write_text(json.dumps(_hashes(tmp), indent=2))
    except OSError as e:
        raise ForgeError(f"cannot write checkpoint {path}: {e.strerror or e} "
                         "(earlier checkpoints are intact; free space or fix the folder, then --resume)") from None
    except SafetensorError as e:  # safetensors reports a failed write (ENOSPC, EIO) as its own error type
        found = re.search(r'message: "([^"]+)"', str(e))
        raise ForgeError(f"cannot write checkpoint {path}: {found.group(1) if found else str(e).splitlines()[0]} "
                         "(earlier checkpoints are intact; free space or fix the folder, then --resume)") from None
    except RuntimeError as e:  # torch.save reports a failed write as "[enforce fail at inline_container.cc]"
        if "inline_container" not in str(e) and "write" not in str(e).lower():
            raise
        raise ForgeError(f"cannot write checkpoint {path}: {str(e).splitlines()[0]} "
                         "(earlier checkpoints are intact; free space or fix the folder, then --resume)") from None
    return Path(path)


def write_manifest(folder: Path) -> None:
    """The folder's manifest (the sha256 of every other file in it, shards included); written last."""
    (Path(folder) / MANIFEST).write_text(json.dumps(_hashes(Path(folder)), indent=2))


def _hashes(folder: Path) -> dict[str, str]:
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        h = hashlib.sha256()
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[f.relative_to(folder).as_posix()] = h.hexdigest()
    return out


def verify_checkpoint(path: Path) -> str | None:
    """None if every file matches the manifest; else what is wrong. A folder written before
    manifests existed is taken as it is."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return None if (Path(path) / STATE).is_file() else f"{path}: no {MANIFEST}"
    try:
        want = json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        return f"{manifest}: unreadable ({e})"
    have = _hashes(Path(path))
    for name, digest in want.items():
        if name not in have:
            return f"{path}: {name} is missing"
        if have[name] != digest:
            return f"{path}: {name} does not match its sha256 in {MANIFEST} (damaged)"
    return None


def split_state(state: StateDict) -> tuple[StateDict, StateDict]:
    """A TrainState's state_dict as (JSON part, tensor part)."""
    return ({k: v for k, v in state.items() if k not in _TENSOR_PARTS},
            {k: v for k, v in state.items() if k in _TENSOR_PARTS})


def _load_training(file: Path) -> StateDict:
    """training_state.pt, weights_only: a planted pickle payload is refused, never run (RNG states
    are saved as tensors and plain types, so nothing beyond torch's safe defaults is needed)."""
    try:
        training: StateDict = torch.load(file, weights_only=True)
        return training
    except pickle.UnpicklingError as e:
        raise ForgeError(f"{file}: refused: it holds objects that are not allowed in a training state "
                         f"(loading is weights_only): {first_line(e, 200)}") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ForgeError(f"{file}: cannot read the training state: {str(e)[:200]}") from None


def load_state_part(file: Path) -> StateDict:
    """One tensor file of a checkpoint (a sharded one's `rng-<rank>.pt`), read as training_state.pt is."""
    return _load_training(Path(file))


def load_position(path: Path) -> StateDict:
    """A checkpoint's step, tokens, metrics and data position (its JSON part alone: no tensors, no collective)."""
    state: StateDict = json.loads((Path(path) / STATE).read_text())
    return state


def load_state(path: Path) -> StateDict:
    """The whole saved TrainState of a checkpoint folder (both files)."""
    state: StateDict = json.loads((Path(path) / STATE).read_text())
    state.update(_load_training(Path(path) / TRAINING))
    return state


def load_optimizer_state(path: Path) -> StateDict | None:
    """The optimizer moments a checkpoint kept (for optim.carry_over), or None."""
    file = Path(path) / TRAINING
    saved: StateDict | None = _load_training(file).get("optimizer") if file.is_file() else None
    return saved


def _steps(folder: Path) -> list[Path]:
    """Complete `step-NNNNNNN` folders, newest first (never a `.partial` or `.old` one a crash left)."""
    steps = [p for p in Path(folder).glob("step-*")
             if _STEP.fullmatch(p.name) and (p / TRAINING).is_file() and (p / STATE).is_file()]
    return sorted(steps, key=lambda p: int(p.name.removeprefix("step-")), reverse=True)  # names _STEP matched


def run_of(path: Path) -> str | None:
    """The run identity a checkpoint was written by (None for one written without it)."""
    try:
        run_id: str | None = json.loads((Path(path) / STATE).read_text()).get("run_id")
        return run_id
    except (OSError, ValueError):
        return None


def latest_checkpoint(folder: Path, run_id: str | None = None,
                      warn: Callable[[str], object] | None = None) -> Path | None:
    """The newest intact resume point under `folder` written by run `run_id` (any run when None).
    A checkpoint whose files fail their hashes is skipped, saying so, for the one before it."""
    warn = warn or (lambda msg: print(f"forge: warning: {msg}", file=sys.stderr))
    for path in _steps(folder):
        if run_id is not None and run_of(path) != run_id:
            continue
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        warn(f"{problem}; using the checkpoint before it")
    return None


def prune_checkpoints(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step folders; return what was deleted."""
    old = _steps(folder)[keep:]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def finished_result(final: Path) -> StateDict | None:
    """The saved result of a stage whose final checkpoint was written intact, else None."""
    state = Path(final) / STATE
    if not state.is_file() or verify_checkpoint(final) is not None:
        return None
    result: StateDict | None = json.loads(state.read_text()).get("result")
    return result
