"""`ShardedCheckpointer`, the FSDP2 implementation of the checkpoint interface (forge.train.checkpointer):
resume points as torch.distributed.checkpoint (DCP) shards that every rank writes, and the stage's
output as a plain Hugging Face folder gathered once and written by rank 0, so evaluation, the
registry and export read it as they read a data-parallel stage's.

A resume point `checkpoints/step-N/` holds `dcp/` (model and optimizer shards and DCP's metadata),
`rng-<rank>.pt` (each rank's RNG), `training_state.pt` (the schedule), `forge_state.json` (step,
tokens, metrics, data position, run identity, world size) and `manifest.json`, written last by
rank 0 once every rank's shards are whole; the folder is filled under `step-N.partial` and renamed
(forge.files.atomic_dir), so a crash never leaves half a checkpoint that --resume would take.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, cast

import torch
from torch.optim.optimizer import StateDict

from forge.errors import ForgeError
from forge.files import atomic_dir
from forge.scrub import first_line
from forge.train import checkpoint as files, fsdp
from forge.train.checkpoint import HfModel
from forge.train.checkpointer import Configure, FinalSave, FullCheckpointer, Process

if TYPE_CHECKING:  # the libraries load with a checkpoint, not with the module
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

SHARDS = "dcp"  # the DCP folder inside a sharded resume point


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


class ShardedCheckpointer:
    """FSDP2 checkpoints. `bind(model, optimizer)` (the session does it once they are sharded) gives
    it what resume points save and load; HF folders (inputs, outputs, merges) go through a FullCheckpointer."""

    def __init__(self, process: Process):
        self.process, self.full = process, FullCheckpointer(process)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def bind(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def _bound(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        if self.model is None or self.optimizer is None:
            raise RuntimeError("ShardedCheckpointer: bind(model, optimizer) first")
        return self.model, self.optimizer

    def load_model(self, path: Path,
                   configure: Configure | None = None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
        return self.full.load_model(path, configure)

    def weights(self, resume_from: Path | None, start: Path) -> Path:
        """A resume point holds shards, not a Hugging Face folder: the model is built from the stage's
        input and the shards are loaded into it with the training state."""
        return Path(start)

    def latest(self, folder: Path, run_id: str | None) -> Path | None:
        path = files.latest_checkpoint(folder, run_id)
        if path is not None and not (path / SHARDS).is_dir():
            raise ForgeError(f"{path}: a whole-model resume point (parallelism.strategy ddp); resume it with "
                             "parallelism.strategy=ddp, or start the stage over (forge run --restart)")
        return path

    def load_state(self, path: Path) -> StateDict:
        """The saved TrainState without its optimizer, which is loaded here with the model from the
        shards (resharded by DCP when the world size changed); this rank's RNG."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        model, optimizer = self._bound()
        state = files.load_state(path)
        saved, world = int(state.get("world", 1)), _world()
        if saved != world and self.process.is_main_process:
            print(f"forge: warning: {path} was written by {saved} processes, resuming on {world}: the model and "
                  "optimizer shards are resharded (the run continues, but not bitwise)", file=sys.stderr)
        msd, osd = get_state_dict(fsdp.resharded(model), optimizer)
        shards: StateDict = {"model": msd, "optimizer": osd}
        try:
            dcp_load(shards, checkpoint_id=str(path / SHARDS))
        except Exception as e:  # DCP raises its CheckpointException (and others) for what it cannot reshard
            raise ForgeError(f"{path}: cannot load the sharded checkpoint of {saved} processes on {world}: "
                             f"{first_line(e)}") from None
        set_state_dict(model, optimizer, model_state_dict=shards["model"], optim_state_dict=shards["optimizer"])
        rng = path / f"rng-{_rank()}.pt"
        state["rng"] = files.load_state_part(rng if rng.is_file() else path / f"rng-{_rank() % saved}.pt")
        state.pop("optimizer", None)
        return state

    def load_optimizer(self, path: Path) -> StateDict | None:
        return self.full.load_optimizer(path)

    def clear(self, folder: Path) -> None:
        self.full.clear(folder)

    def _write(self, path: Path, every_rank: Callable[[Path], None], main: Callable[[Path], None]) -> None:
        """Fill `path` atomically: every rank writes its part into the folder rank 0 made, then rank 0
        adds its files and the manifest and renames the folder into place."""
        p = self.process
        p.wait_for_everyone()
        tmp = Path(path).with_name(Path(path).name + ".partial")
        try:
            with contextlib.ExitStack() as stack:
                if p.is_main_process:
                    tmp = stack.enter_context(atomic_dir(Path(path)))
                p.wait_for_everyone()  # the folder exists
                every_rank(tmp)
                p.wait_for_everyone()  # every rank's shards are whole
                if p.is_main_process:
                    main(tmp)
                    files.write_manifest(tmp)
        except OSError as e:
            raise ForgeError(f"cannot write checkpoint {path}: {e.strerror or e} "
                             "(earlier checkpoints are intact; free space or fix the folder, then --resume)") from None
        p.wait_for_everyone()  # renamed

    def save_resumable(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
                       keep_last: int | None) -> Path:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        sharded, optimizer = self._bound()  # the shards are the bound model's
        training = state["training"]
        json_part = {**{k: v for k, v in state.items() if k != "training"}, "world": _world(), "strategy": "fsdp"}

        def shards(tmp: Path) -> None:
            msd, osd = get_state_dict(fsdp.resharded(sharded), optimizer)
            dcp_save({"model": msd, "optimizer": osd}, checkpoint_id=str(tmp / SHARDS))
            torch.save(training["rng"], tmp / f"rng-{_rank()}.pt")

        def main(tmp: Path) -> None:
            (tmp / files.STATE).write_text(json.dumps(json_part, indent=2))
            torch.save({"scheduler": training["scheduler"], "rng": training["rng"]}, tmp / files.TRAINING)

        self._write(Path(path), shards, main)
        if keep_last and self.process.is_main_process:
            files.prune_checkpoints(Path(path).parent, keep_last)
        self.process.wait_for_everyone()
        return Path(path)

    def _plain(self, model: HfModel) -> HfModel:
        """Rank 0: an unsharded copy of the model with the trained weights; other ranks: the model itself
        (a collective: every rank calls it)."""
        state = fsdp.full_model_state(model)
        if not self.process.is_main_process:
            return model
        from transformers import AutoModelForCausalLM

        hf = fsdp.hf_model(model)
        plain: HfModel = AutoModelForCausalLM.from_config(hf.config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        plain.generation_config = hf.generation_config
        if hasattr(model, "peft_config"):  # adapters train (forge.train.lora): the copy gets the same ones
            from peft import get_peft_model

            plain = get_peft_model(plain, cast("PeftModel", model).peft_config["default"])
        missing, unexpected = plain.load_state_dict(state, strict=False)
        tied = {k for k in missing if "lm_head" in k and getattr(hf.config, "tie_word_embeddings", False)}
        if set(missing) - tied or unexpected:
            raise ForgeError(f"gathering the sharded model: missing {sorted(set(missing) - tied)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        return plain.eval()

    def save(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
             training: StateDict | None = None) -> Path:
        return self.full.save(self._plain(model), tokenizer, path, state, training)

    def save_final(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
                   final: FinalSave) -> Path:
        """The stage's output: a Hugging Face folder, gathered once, written by rank 0 (as a data-parallel
        stage writes it: LoRA merged or as an adapter; the optimizer state whole, by index)."""
        training = final.training
        if training is not None:
            model_, optimizer = self._bound()
            training = {**training, "optimizer": fsdp.full_optimizer_state(model_, optimizer)}
        plain = self._plain(model)
        return self.full.save_final(plain, tokenizer, path, state, FinalSave(training, final.lora, final.base))

    def merge_back(self, trained: Path, start: Path, weight: float, out: Path) -> Path:
        return self.full.merge_back(trained, start, weight, out)

    def average(self, folders: list[Path], weights: list[float], out: Path, extra: dict[str, str]) -> Path:
        return self.full.average(folders, weights, out, extra)
