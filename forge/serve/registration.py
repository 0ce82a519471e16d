"""A saved checkpoint as a registered model (serve.yaml's `tracking.register: NAME`): each save_state's
adapter merged into its base (forge.export.merged: a whole Hugging Face model, what `models:/NAME/N`
consumers load), logged on the client's MLflow run and registered as a new version of NAME with the
alias `candidate`, its lineage.json among the model's files, and tags: the base, the stages, the
tinker path, the training run, the step and the lineage.

The worker only copies the checkpoint (its adapter and tokenizer: small) before it answers the save;
the merge and the registration run on the run's MLflow thread (forge.serve.tracking.RunLog), from
the copy, so a later save of the same name, a deletion or an expiry never changes what is registered
and no model call waits for the store. A failure is said in the server's log and never fails the save."""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.lineage import Lineage
from forge.track.notes import base_summary
from forge.track.registry import CANDIDATE, TEXT_LIMIT
from forge.train import checkpoint as files

log = logging.getLogger("forge.serve")
LINEAGE = "lineage.json"


@dataclass(frozen=True)
class Saved:
    """A save_state checkpoint to register: its copy (in a scratch folder of its own) and what it is."""

    copy: Path
    tinker_path: str
    training_run_id: str
    step: int


def snapshot(folder: Path, scratch: Path, tinker_path: str, training_run_id: str, step: int) -> Saved:
    """Copy the checkpoint, less its optimizer moments, into a new folder under `scratch`."""
    scratch.mkdir(parents=True, exist_ok=True)
    own = Path(tempfile.mkdtemp(prefix="register-", dir=scratch))
    try:
        shutil.copytree(folder, own / "checkpoint", ignore=shutil.ignore_patterns(files.TRAINING))
    except OSError:
        shutil.rmtree(own, ignore_errors=True)
        raise
    return Saved(own / "checkpoint", tinker_path, training_run_id, step)


def version_tags(saved: Saved, lineage: Lineage) -> dict[str, str]:
    return {"forge.base": base_summary(lineage.base.spec, lineage.base.checkpoint),
            "forge.stages": ",".join(s.name for s in lineage.stages),
            "forge.tinker_path": saved.tinker_path, "forge.training_run_id": saved.training_run_id,
            "forge.step": str(saved.step), "forge.lineage": lineage_tag(lineage)}


def lineage_tag(lineage: Lineage) -> str:
    """The lineage as compact JSON where it fits a tag (a served one does: a base and one stage),
    else in brief; the whole of it is the version's lineage.json either way."""
    text = json.dumps(lineage.to_dict(), separators=(",", ":"))
    if len(text) <= TEXT_LIMIT:
        return text
    stages = " -> ".join(f"{s.name} ({s.kind}, {s.steps} steps)" for s in lineage.stages)
    return f"{lineage.name}: {base_summary(lineage.base.spec)} -> {stages} (the whole lineage: {LINEAGE})"


def register(tracker: Any, name: str, saved: Saved) -> int | None:
    """On the run's thread, `tracker` its MlflowTracker with the run active: merge, register, tag.
    The version, or None where it failed (said in the log)."""
    from forge.export.merged import write_merged

    try:
        lineage = Lineage.read(saved.copy / LINEAGE)
        tags = version_tags(saved, lineage)
        merged = write_merged(saved.copy, saved.copy.parent / "merged")
        version: int | None = tracker.register_model(merged, name, CANDIDATE, tags, files=(LINEAGE,))
        if version is not None:
            tracker.set_version_tags(name, version, tags)  # register_model shows only forge's usual few
            log.info("registered %s as %s version %d (alias %s)", saved.tinker_path, name, version, CANDIDATE)
        return version
    except Exception:  # registering never fails the save: the checkpoint is on disk, as answered
        log.exception("registering %s as %s failed; the checkpoint is saved, unregistered", saved.tinker_path, name)
        return None
    finally:
        shutil.rmtree(saved.copy.parent, ignore_errors=True)
