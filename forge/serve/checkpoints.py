"""Saved weights of served models, under the config's checkpoint_dir:

    <run>/run.json                      the training run: its owner (an API key's fingerprint), base, LoRA
    <run>/weights/<name>/               save_state: tinker://<run id>/weights/<name>
    <run>/sampler_weights/<name>/       save_weights_for_sampler: tinker://<run id>/sampler_weights/<name>

Each checkpoint is a forge checkpoint folder as a stage's `final/` with `lora.merge: false` is
(forge.train.checkpoint): the PEFT adapter (adapter_config.json names the base's folder), the
tokenizer, forge_state.json (steps, tokens, the tinker path), training_state.pt (the optimizer's
moments, save_state only), lineage.json (forge.lineage) and manifest.json (every file's sha256,
checked before a load). `forge eval` loads it as the base with the adapter; `forge export` merges
the adapter into the base's weights. A checkpoint is written in a temporary folder renamed into
place (forge.files.atomic_dir): a server killed mid-save leaves the earlier checkpoint or none,
never half of one.

A save with ttl_seconds records its expiry (forge_state.json's expires_at). From then on the
checkpoint is neither listed nor loaded, and it is deleted on the worker thread, which writes and
reads checkpoints too (so a deletion never meets a save of the same name half-way), or when the
server starts.

A run's checkpoints belong to the API key whose client made the run: a path of another key's run
is refused (403), an unknown one is not found (404), naming the path."""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from pydantic import BaseModel, ConfigDict

from forge.errors import ForgeError
from forge.files import atomic_dir
from forge.lineage import StageRecord, new_lineage
from forge.serve.config import BaseSpec
from forge.serve.trainer import ServedModel
from forge.serve.wire import Refused
from forge.train import checkpoint as files

PREFIX = "tinker://"
KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path segment -> the SDK's checkpoint_type
RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:train:[0-9]+")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RUN_FILE = "run.json"
ADAPTER = "adapter_model.safetensors"
log = logging.getLogger("forge.serve")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def now() -> str:
    return utcnow().isoformat(timespec="seconds")


class RunRecord(BaseModel):
    """A training run (one training client's model) as run.json keeps it."""

    model_config = ConfigDict(extra="ignore")
    training_run_id: str
    owner: str                  # the fingerprint of the API key that made it (never the key)
    base_model: str             # the config's name of the base
    base: str                   # the base's local folder
    rank: int
    alpha: float
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    created: str = ""
    resumed_from: str | None = None
    user_metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class CheckpointPath:
    run: str
    kind: str  # "weights" or "sampler_weights"
    name: str

    @property
    def tinker(self) -> str:
        return f"{PREFIX}{self.run}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"


def check_name(name: str | None, field: str) -> str:
    if name is None or not NAME.fullmatch(name) or name.endswith((".partial", ".old")):
        raise Refused(f"{field} {name!r}: a checkpoint name is 1-128 letters, digits, '.', '_' or '-', starting "
                      "with a letter or digit, not ending in .partial or .old")
    return name


def parse(text: str, field: str = "path") -> CheckpointPath:
    """A tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME path, else refused naming it."""
    parts = text.removeprefix(PREFIX).split("/") if text.startswith(PREFIX) else []
    if len(parts) != 3 or not RUN_ID.fullmatch(parts[0]) or parts[1] not in KINDS or not NAME.fullmatch(parts[2]):
        raise Refused(f"{field} {text!r}: expected tinker://<training run id>/weights/<name> or "
                      "tinker://<training run id>/sampler_weights/<name>, as save_state and save_weights_for_sampler "
                      "answer")
    return CheckpointPath(*parts)


class Store:
    def __init__(self, root: Path, clock: Callable[[], dt.datetime] | None = None):
        self.root = Path(root)
        self.clock = clock or utcnow  # the time (UTC) saves are stamped with and expiries measured by
        self.expired_seen = False  # a listing or load met an expired checkpoint: the worker should sweep

    def live(self, saved: dict[str, Any]) -> bool:
        """Whether a checkpoint (its forge_state.json) has not expired."""
        when = saved.get("expires_at")
        return when is None or dt.datetime.fromisoformat(when) > self.clock()

    def expire(self, folder: Path) -> bool:
        """Delete the checkpoint folder if it expired; whether it did. Only where no save or load
        runs beside it: the server's start, or the worker thread."""
        state = folder / files.STATE
        if not state.is_file() or self.live(json.loads(state.read_text())):
            return False
        shutil.rmtree(folder)
        log.info("deleted %s: its ttl_seconds ran out", folder)
        return True

    def sweep(self) -> list[Path]:
        """Delete every expired checkpoint (as `expire`); the folders deleted."""
        self.expired_seen = False
        found = sorted(self.root.glob(f"*/*/*/{files.STATE}")) if self.root.is_dir() else []
        return [s.parent for s in found if s.parent.parent.name in KINDS and NAME.fullmatch(s.parent.name)
                and self.expire(s.parent)]

    def run_dir(self, run_id: str) -> Path:
        if not RUN_ID.fullmatch(run_id):
            raise Refused(f"training run {run_id!r}: no such training run", 404)
        return self.root / run_id.replace(":", "_")

    def folder(self, path: CheckpointPath) -> Path:
        return self.run_dir(path.run) / path.kind / path.name

    def add_run(self, record: RunRecord) -> None:
        folder = self.run_dir(record.training_run_id)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{RUN_FILE}.partial"
        tmp.write_text(record.model_dump_json(indent=2))
        os.replace(tmp, folder / RUN_FILE)

    def run(self, run_id: str) -> RunRecord | None:
        file = self.run_dir(run_id) / RUN_FILE
        return RunRecord.model_validate_json(file.read_text()) if file.is_file() else None

    def owned_run(self, run_id: str, owner: str, what: str) -> RunRecord:
        """The run, if this key's; else refused: 404 unknown, 403 another key's."""
        record = self.run(run_id)
        if record is None:
            raise Refused(f"{what}: no such training run on this server", 404)
        if record.owner != owner:
            raise Refused(f"{what}: belongs to another client's training run (another API key); a client reaches "
                          "only its own key's checkpoints", 403)
        return record

    def runs(self, owner: str) -> list[RunRecord]:
        """This key's runs, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for file in self.root.glob(f"*/{RUN_FILE}"):
            record = RunRecord.model_validate_json(file.read_text())
            if record.owner == owner:
                found.append(record)
        return sorted(found, key=lambda r: r.created, reverse=True)

    def existing(self, path: CheckpointPath, owner: str, field: str = "path") -> tuple[RunRecord, Path]:
        """(run, folder) of a whole checkpoint this key may read; else refused naming the path."""
        record = self.owned_run(path.run, owner, f"{field} {path.tinker}")
        folder = self.folder(path)
        if not (folder / files.STATE).is_file():
            raise Refused(f"{field} {path.tinker}: no such checkpoint (its run has "
                          f"{', '.join(c['checkpoint_id'] for c in self.listing(path.run)) or 'none'})", 404)
        saved = json.loads((folder / files.STATE).read_text())
        if not self.live(saved):
            self.expired_seen = True
            raise Refused(f"{field} {path.tinker}: expired at {saved['expires_at']} (saved with ttl_seconds)", 404)
        problem = files.verify_checkpoint(folder)
        if problem is not None:
            raise Refused(f"{field} {path.tinker}: the checkpoint is damaged ({problem})")
        return record, folder

    def listing(self, run_id: str) -> list[dict[str, Any]]:
        """The run's whole checkpoints as tinker.types.Checkpoint, oldest first (a folder a kill left
        half-written, *.partial or *.old, is never one)."""
        out = []
        for kind, kind_type in KINDS.items():
            base = self.run_dir(run_id) / kind
            for folder in sorted(base.iterdir()) if base.is_dir() else []:
                if not NAME.fullmatch(folder.name) or folder.name.endswith((".partial", ".old")):
                    continue
                state = folder / files.STATE
                if not state.is_file():
                    continue
                saved = json.loads(state.read_text())
                if not self.live(saved):
                    self.expired_seen = True
                    continue
                path = CheckpointPath(run_id, kind, folder.name)
                size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                out.append({"checkpoint_id": path.checkpoint_id, "checkpoint_type": kind_type,
                            "time": saved.get("saved", now()), "tinker_path": path.tinker, "size_bytes": size,
                            "public": False, "user_metadata": saved.get("user_metadata"),
                            "expires_at": saved.get("expires_at")})
        return sorted(out, key=lambda c: c["time"])

    def delete(self, path: CheckpointPath, owner: str) -> None:
        _, folder = self.existing(path, owner)
        shutil.rmtree(folder)


@dataclass(frozen=True)
class Asked:
    """What a save request asked for beside the weights, and when it ran."""

    at: dt.datetime
    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None

    @property
    def expires_at(self) -> str | None:
        if self.ttl_seconds is None:
            return None
        return (self.at + dt.timedelta(seconds=self.ttl_seconds)).isoformat(timespec="seconds")


def write(folder: Path, model: ServedModel, record: RunRecord, spec: BaseSpec, path: CheckpointPath,
          optimizer: bool, asked: Asked) -> Path:
    """The checkpoint folder (see the module doc), written whole or not at all."""
    session = model.session
    peft: Any = session.unwrapped()
    peft.peft_config["default"].base_model_name_or_path = str(model.base.resolve())
    state = {"step": model.steps, "tokens": model.tokens, "run_id": record.training_run_id,
             "tinker_path": path.tinker, "saved": asked.at.isoformat(timespec="seconds"),
             "user_metadata": asked.user_metadata, "expires_at": asked.expires_at}
    try:
        with atomic_dir(folder) as tmp:
            # the LoRA tensors alone: PEFT would add whole embedding matrices when lm_head is a target
            peft.save_pretrained(str(tmp), safe_serialization=True, save_embedding_layers=False)
            session.tokenizer.save_pretrained(tmp)
            (tmp / files.STATE).write_text(json.dumps(state, indent=2))
            if optimizer:
                torch.save({"optimizer": session.optimizer.state_dict()}, tmp / files.TRAINING)
            _lineage(model, record, spec, path).write(tmp / "lineage.json")
            files.write_manifest(tmp)
    except OSError as e:
        raise ForgeError(f"cannot write checkpoint {path.tinker} ({folder}): {e.strerror or e}; earlier checkpoints "
                         "are intact") from None
    return folder


def _lineage(model: ServedModel, record: RunRecord, spec: BaseSpec, path: CheckpointPath) -> Any:
    from forge import catalog

    phase = catalog.resolve(spec.base).record() if spec.is_catalog else None
    lineage = new_lineage(f"serve-{path.name}", spec.base, model.base, phase)
    settings = {"lora": {"rank": record.rank, "alpha": record.alpha, "targets": list(model.adapters.target_modules)},
                "loss_fns": sorted(model.losses), "optimizer": "adamw", "precision": model.settings.precision,
                "resumed_from": record.resumed_from}
    lineage.stages.append(StageRecord(name="serve", kind="serve", settings=settings, input_checkpoint=str(model.base),
                                      output_checkpoint=path.tinker, steps=model.steps,
                                      tokens_by_source={"api": model.tokens}))
    return lineage


def read_adapter(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the adapter's tensors under PEFT's saved names, its adapter_config.json)."""
    from safetensors.torch import load_file

    config: dict[str, Any] = json.loads((folder / "adapter_config.json").read_text())
    return load_file(str(folder / ADAPTER)), config


def read_optimizer(folder: Path, path: CheckpointPath) -> dict[str, Any]:
    saved = files.load_optimizer_state(folder)
    if saved is None:
        raise Refused(f"path {path.tinker}: holds no optimizer state (a sampler checkpoint, or saved without it); "
                      "load it without the optimizer", 400)
    return saved


def step_of(folder: Path) -> int:
    return int(files.load_position(folder).get("step", 0))
