"""A training session: the accelerator, model, tokenizer, optimizer and schedule of one stage,
set up the same way for every stage kind (seed, precision, resume point, optimizer carry-over),
and the checkpoints it writes (rank 0 only, atomically)."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from forge.errors import ForgeError
from forge.train.accel import new_accelerator
from forge.train.checkpoint import (latest_checkpoint, load_optimizer_state, load_state, prune_checkpoints,
                                    save_checkpoint, split_state)
from forge.train.memory import PeakMemory
from forge.train.optim import build_optimizer, build_scheduler, carry_over


@dataclass
class Session:
    settings: object          # the stage's TrainSettings
    accelerator: object
    model: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    total_steps: int
    memory: PeakMemory
    out_dir: Path
    resume_from: Path | None  # the checkpoint this session continues, if resuming
    run_id: str | None = None  # the run identity stamped into (and required of) resume checkpoints

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def device(self):
        return self.accelerator.device

    def restore(self, state) -> bool:
        """Load the resume point into `state` (a TrainState); False when starting fresh."""
        if self.resume_from is None:
            return False
        state.load_state_dict(load_state(self.resume_from))
        if state.step >= self.total_steps:  # e.g. a checkpoint of a longer run: 0 steps left to train
            raise ForgeError(f"stage {self.settings.name}: resume point {self.resume_from} is at step {state.step}, "
                             f"but the stage now has only {self.total_steps} steps; it belongs to another "
                             "run or settings: start the stage over (forge run --restart)")
        return True

    def save(self, path: Path, state: dict, training: dict | None = None) -> Path:
        """Write a checkpoint folder (rank 0; the other ranks wait for it)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            save_checkpoint(acc.unwrap_model(self.model), self.tokenizer, path, state=state, training=training)
        acc.wait_for_everyone()
        return path

    def save_resumable(self, state) -> Path:
        """A `checkpoints/step-N` folder a later `--resume` continues from bitwise."""
        as_json, tensors = split_state(state.state_dict())
        folder = self.out_dir / "checkpoints"
        path = self.save(folder / f"step-{state.step:07d}", {**as_json, "run_id": self.run_id}, tensors)
        keep = self.settings.checkpoint.keep_last_n
        if keep and self.accelerator.is_main_process:  # only once the new one is whole
            prune_checkpoints(folder, keep)
        return path


def load_model(checkpoint: Path, configure: Callable | None = None):
    """(model, tokenizer) in fp32 from a Hugging Face folder; `configure(config)` may change the
    config first (context extension), the weights then load into the changed model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        config = AutoConfig.from_pretrained(checkpoint)
        if configure is not None:
            config = configure(config)
        model = AutoModelForCausalLM.from_pretrained(checkpoint, config=config, dtype=torch.float32, use_safetensors=True)
    except (OSError, ValueError) as e:
        raise ForgeError(f"cannot load checkpoint {checkpoint}: {e}") from None
    return model, tokenizer


def open_session(settings, checkpoint: Path, out_dir: Path, resume: bool = False,
                 configure: Callable | None = None, run_id: str | None = None,
                 wrap: Callable | None = None) -> Session:
    """Set up a stage: accelerator and seed, the model (from the newest resumable checkpoint in
    `out_dir/checkpoints` when `resume`), optimizer (carrying the input's moments over when
    `optim.carry_over`), and the schedule over the stage's total steps. `run_id`: the run identity;
    a resume only continues checkpoints it wrote, and a fresh start deletes the folder's old ones.
    `wrap(model)` may wrap the model before the optimizer sees it (LoRA adapters)."""
    from accelerate.utils import set_seed

    where = f"stage {settings.name}"
    accelerator = new_accelerator(settings.precision, where)
    set_seed(settings.seed)
    memory = PeakMemory(accelerator.device)
    resume_from = latest_checkpoint(Path(out_dir) / "checkpoints", run_id) if resume else None
    if resume_from is None and accelerator.is_main_process:
        # checkpoints an earlier run left here must never be taken for this run's
        shutil.rmtree(Path(out_dir) / "checkpoints", ignore_errors=True)
    accelerator.wait_for_everyone()
    model, tokenizer = load_model(resume_from or checkpoint, configure)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and settings.seq_len > max_pos:
        raise ForgeError(f"{where}: seq_len {settings.seq_len} exceeds the model's context ({max_pos}); "
                         "extend it in a midtrain stage with a context: block")
    if wrap is not None:
        model = wrap(model)
    optimizer = build_optimizer(model, settings.optim)
    if settings.optim.carry_over and resume_from is None:
        saved = load_optimizer_state(checkpoint)
        if saved is None:
            raise ForgeError(f"{where}: optim.carry_over: the input checkpoint {checkpoint} has no optimizer state "
                             "(a base model, or a stage run with checkpoint.final_optimizer: false); "
                             "set optim.carry_over: false")
        carry_over(optimizer, saved, settings.optim, where)
    total_steps = settings.total_steps(accelerator.num_processes)
    scheduler = build_scheduler(optimizer, total_steps, settings.schedule)
    # the scheduler stays unprepared: accelerate would step it once per process each step, while
    # total_steps already counts optimizer steps of the whole data-parallel world
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    return Session(settings, accelerator, model, tokenizer, optimizer, scheduler, total_steps, memory,
                   Path(out_dir), resume_from, run_id)
