"""A training session: the accelerator, model, tokenizer, optimizer and schedule of one stage,
set up the same way for every stage kind (seed, precision, parallelism strategy, resume point,
optimizer carry-over, LoRA adapters), and the checkpoints it writes through its checkpointer."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ContextManager, Protocol

import torch

if TYPE_CHECKING:  # imported when a session opens, not with the module
    from accelerate import Accelerator
    from transformers import PreTrainedTokenizerBase

from forge.data.packing import pad_token_id
from forge.errors import ForgeError
from forge.rundir import CHECKPOINTS, FINAL
from forge.train import fsdp
from forge.train.accel import new_accelerator
from forge.train.checkpoint import HfModel, split_state
from forge.train.checkpointer import Checkpointer, Configure, FinalSave
from forge.train.compiled import compile_layers
from forge.train.fsdp import Options
from forge.train.lora import wrap_lora
from forge.train.memory import PeakMemory
from forge.train.meter import Flops
from forge.train.optim import build_optimizer, build_scheduler, carry_over
from forge.train.parallel import STRATEGIES, Strategy, strategy
from forge.train.settings import LoraSettings, ParallelismSettings, TrainSettings
from forge.train.state import TrainState


class Place(Protocol):
    """Where a session starts and writes (forge.stages.result.StageInputs has these)."""

    @property
    def checkpoint(self) -> Path: ...     # the input checkpoint
    @property
    def out_dir(self) -> Path: ...        # stages/<name>: final/ and checkpoints/
    @property
    def resume(self) -> bool: ...         # continue from the newest resume point in out_dir/checkpoints
    @property
    def run_id(self) -> str | None: ...   # resume continues only checkpoints this run wrote
    @property
    def parallelism(self) -> ParallelismSettings | str: ...  # a strategy name stands for its defaults
    @property
    def flops(self) -> Flops | None: ...  # model FLOPs per token and the chip's peak (None: no MFU)


@dataclass
class Session:
    settings: TrainSettings
    accelerator: Accelerator
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    total_steps: int
    memory: PeakMemory
    checkpoints: Checkpointer
    place: Place
    resume_from: Path | None  # the checkpoint this session continues, if resuming
    lora: LoraSettings | None = None  # when the stage trains adapters
    strategy: Strategy = STRATEGIES["ddp"]
    options: Options = Options()

    @property
    def world(self) -> int:
        return int(self.accelerator.num_processes)

    @property
    def rank(self) -> int:
        return int(self.accelerator.process_index)

    @property
    def device(self) -> torch.device:
        device: torch.device = self.accelerator.device
        return device

    @property
    def is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)

    @property
    def sharded(self) -> bool:
        """The weights are split over the ranks (fsdp): every rank takes part in each forward pass,
        so sample generation runs on every rank (rank 0 alone logs it)."""
        return self.strategy.sharded

    def gathered(self) -> ContextManager[None]:
        """The whole weights in the model while inside (every rank enters): e.g. to copy them into vLLM."""
        return fsdp.gathered(self.model) if self.sharded else contextlib.nullcontext()

    @property
    def pad_id(self) -> int:
        return pad_token_id(self.tokenizer)

    def unwrapped(self) -> HfModel:
        """The model without the strategy's wrapper (DDP): the transformers model, or PEFT's around it."""
        model: HfModel = self.accelerator.unwrap_model(self.model)
        return model

    def frozen_input(self, path: Path | None = None) -> torch.nn.Module:
        """A frozen copy of the stage's input checkpoint (or of `path`) on this device (a reference
        model), sharded as the policy is."""
        model, _ = self.checkpoints.load_model(Path(path or self.place.checkpoint))
        model = self.strategy.shard(model.to(self.device).requires_grad_(False), self.options, self.device)
        return model.eval()

    def restore(self, state: TrainState) -> bool:
        """Load the resume point into `state`; False when starting fresh."""
        if self.resume_from is None:
            return False
        saved = self.checkpoints.load_state(self.resume_from)
        step = int(saved["step"])
        if step >= self.total_steps:  # e.g. a checkpoint of a longer run: 0 steps left to train (said before
            # the data position is read: a launch's prepared blocks end at this stage's last step)
            raise ForgeError(f"stage {self.settings.name}: resume point {self.resume_from} is at step {step}, "
                             f"but the stage now has only {self.total_steps} steps; it belongs to another "
                             "run or settings: start the stage over (forge run --restart)")
        state.load_state_dict(saved)
        return True

    def save_resumable(self, state: TrainState) -> Path:
        """A `checkpoints/step-N` folder a later `--resume` continues from bitwise."""
        as_json, tensors = split_state(state.state_dict())
        path = Path(self.place.out_dir) / CHECKPOINTS / f"step-{state.step:07d}"
        return self.checkpoints.save_resumable(self.unwrapped(), self.tokenizer, path,
                                               {**as_json, "run_id": self.place.run_id, "training": tensors},
                                               self.settings.checkpoint.keep_last_n)

    @property
    def final_dir(self) -> Path:
        """The stage's output folder (forge.rundir's layout: stages/NAME/final)."""
        return Path(self.place.out_dir) / FINAL

    def save_final(self, state: TrainState, result: dict[str, object], template: str | None = None) -> Path:
        """The stage's output `final/`: weights (LoRA merged, or the adapter with `lora.merge: false`),
        the tokenizer with the chat template, the resume state and the stage result."""
        if template is not None:
            self.tokenizer.chat_template = template
        as_json, tensors = split_state(state.state_dict())
        keep = tensors if self.settings.checkpoint.final_optimizer else None
        path = self.final_dir
        return self.checkpoints.save_final(self.unwrapped(), self.tokenizer, path, {**as_json, "result": result},
                                           FinalSave(keep, self.lora, Path(self.place.checkpoint)))


def open_session(settings: TrainSettings, place: Place, configure: Configure | None = None,
                 lora: LoraSettings | None = None) -> Session:
    """Set up a stage: accelerator and seed, the model (from the newest resumable checkpoint in
    `out_dir/checkpoints` when resuming), LoRA adapters (`lora`: only they train), the optimizer
    (carrying the input's moments over when `optim.carry_over`), the schedule over the stage's
    total steps, and the strategy's wrapping. A fresh start deletes the folder's old resume points.
    `configure(config)` may change the model config before the weights load (context extension)."""
    from accelerate.utils import set_seed

    where = f"stage {settings.name}"
    plan, opts = strategy(place.parallelism), fsdp.options(place.parallelism)
    accelerator = new_accelerator(settings.precision, where)
    checkpoints = plan.checkpointer(accelerator)
    set_seed(settings.seed)
    memory = PeakMemory(accelerator.device)
    folder = Path(place.out_dir) / CHECKPOINTS
    resume_from = checkpoints.latest(folder, place.run_id) if place.resume else None
    if resume_from is None:
        checkpoints.clear(folder)
    model, tokenizer = checkpoints.load_model(checkpoints.weights(resume_from, place.checkpoint), configure)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and settings.seq_len > max_pos:
        raise ForgeError(f"{where}: seq_len {settings.seq_len} exceeds the model's context ({max_pos}); "
                         "extend it in a midtrain stage with a context: block")
    if lora is not None:
        model = wrap_lora(model, lora, where)
    if opts.activation_checkpointing:
        fsdp.checkpoint_activations(model)
    if settings.compile:
        compile_layers(model, where)
    model = plan.shard(model, opts, accelerator.device)  # before the optimizer: FSDP2 replaces the parameters
    if not plan.sharded:  # a fused optimizer is built on the parameters' device (accelerate moves them anyway)
        model = model.to(accelerator.device)
    optimizer = build_optimizer(model, settings.optim, accelerator.device)
    if settings.optim.carry_over and resume_from is None:
        saved = checkpoints.load_optimizer(place.checkpoint)
        if saved is None:
            raise ForgeError(f"{where}: optim.carry_over: the input checkpoint {place.checkpoint} has no optimizer "
                             "state (a base model, or a stage run with checkpoint.final_optimizer: false); "
                             "set optim.carry_over: false")
        load = (lambda state: fsdp.load_full_optimizer(model, optimizer, state)) if plan.sharded else None
        carry_over(optimizer, saved, settings.optim, where, load)
    total_steps = settings.total_steps(accelerator.num_processes)
    scheduler = build_scheduler(optimizer, total_steps, settings.schedule)
    # the scheduler stays unprepared: accelerate would step it once per process each step, while
    # total_steps already counts optimizer steps of the whole data-parallel world
    model, optimizer = plan.prepare(accelerator, model, optimizer)
    checkpoints.bind(model, optimizer)
    model.train()
    return Session(settings, accelerator, model, tokenizer, optimizer, scheduler, total_steps, memory,
                   checkpoints, place, resume_from, lora, plan, opts)
