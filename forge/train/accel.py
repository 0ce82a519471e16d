"""One `accelerate.Accelerator` per stage, and the few device-specific facts the training core needs
(peak memory, the process-group backend, pinned memory): the only place it names a device type.

accelerate keeps its settings in process-wide singletons and refuses a second Accelerator with
another precision; stages of one pipeline may differ (fp32 then bf16), so each stage clears the
per-run state first. The process group (PartialState) is kept: it belongs to the launch, not the stage.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from forge.errors import ForgeError

if TYPE_CHECKING:  # imported when a stage starts, not with the module
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState, GradientState

_MIXED = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def new_accelerator(precision: str, where: str) -> Accelerator:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    if precision == "fp16" and not torch.cuda.is_available():
        raise ForgeError(f"{where}: precision fp16 needs a GPU; use bf16 or fp32 on CPU")
    _reset_accelerate(AcceleratorState, GradientState)
    return Accelerator(mixed_precision=_MIXED[precision], cpu=_multi_cpu())


# Library internals the training core calls, each wrapped once below; tests/train/test_internals.py
# fails, naming the wrapper, when a release moves one.
PRIVATE = (("accelerate.state", "AcceleratorState._reset_state"), ("accelerate.state", "GradientState._reset_state"),
           ("torch.optim.optimizer", "_get_fused_kernels_supported_devices"))


def _reset_accelerate(accelerator_state: type[AcceleratorState], gradient_state: type[GradientState]) -> None:
    """Clear accelerate's per-run singletons (keeping the process group). No public API does this:
    the public way is one Accelerator per process, i.e. one stage per process, which a pipeline of
    stages with different precisions in one process cannot keep."""
    accelerator_state._reset_state(reset_partial_state=False)
    gradient_state._reset_state()


def _multi_cpu() -> bool:
    """Several CPU processes (torchrun / accelerate launch without GPUs): accelerate forms a gloo
    process group only when told it is on CPU."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()


def process_state() -> PartialState:
    """This process's place in the launch (rank, world size, barriers), for pipeline-level work:
    accelerate's PartialState (a forge.train.checkpointer.Process among other things)."""
    from accelerate import PartialState

    return PartialState(cpu=_multi_cpu())


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new allocator peak on an accelerator (CUDA, XPU, any torch.accelerator); False on CPU."""
    if device.type == "cpu" or not torch.accelerator.is_available():
        return False
    torch.accelerator.reset_peak_memory_stats(device)
    return True


def peak_memory_bytes(device: torch.device) -> int:
    """The accelerator allocator's peak since `reset_peak_memory`."""
    return int(torch.accelerator.max_memory_allocated(device))


def device_name(device: torch.device) -> str:
    """What the runtime calls this device ("NVIDIA H100 80GB HBM3"), or its type ("cpu")."""
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and backend is not None and hasattr(backend, "get_device_name"):
        return str(backend.get_device_name(device))
    return device.type


def has_fused_adamw(device: torch.device) -> bool:
    """Whether torch has a fused AdamW kernel for this device type (it checks only at the first step).
    torch's own list is private; the public alternative, `fused=True` and catching the error at the
    first step, would fail a stage after its setup."""
    from torch.optim import optimizer

    supported: list[str] = getattr(optimizer, "_get_fused_kernels_supported_devices")()  # torch's own list
    return device.type in supported


def group_backend(device: torch.device) -> str | None:
    """The process-group backend for a device (None: torch's default for it)."""
    return {"cpu": "gloo", "cuda": "nccl"}.get(device.type)


def pins_memory(device: torch.device) -> bool:
    """Whether host memory is pinned for copies to the device (CPU offload)."""
    return device.type == "cuda"
