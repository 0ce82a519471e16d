"""Training stacks (stacks.yaml): what each framework overlaps and what it loses outside matmuls.

A Stack is plain data read by parallel.step_time; the chip's matmul efficiency stays a property of
the chip and precision (hardware.yaml), so the two are never counted twice.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from forge.errors import ForgeError

STACKS_FILE = Path(__file__).with_name("stacks.yaml")

FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: the same data, faster


@dataclass(frozen=True)
class Stack:
    key: str
    name: str
    elementwise_passes: float
    attention_efficiency: float
    tp_overlap: float
    dp_overlap: float
    cp_overlap: float
    interleaved_pp: bool
    context_parallel: bool
    zero: tuple[int, ...]


def load_stacks() -> dict:
    try:
        stamp = STACKS_FILE.stat().st_mtime_ns
    except OSError:
        stamp = 0
    return copy.deepcopy(_parse(stamp))


@functools.lru_cache(maxsize=4)
def _parse(stamp: int) -> dict:
    """stacks.yaml parsed once per version of the file (a plan builds a stack for every layout search)."""
    return (yaml.load(STACKS_FILE.read_text(), Loader=FAST) or {}).get("stacks", {})


def known_stacks() -> list[str]:
    return sorted(load_stacks())


def get_stack(name: str) -> Stack:
    stacks = load_stacks()
    key = str(name).strip().lower()
    if key not in stacks:
        raise ForgeError(f"unknown stack {name!r}; known stacks: {', '.join(sorted(stacks))}")
    raw = stacks[key]
    return Stack(
        key=key, name=str(raw.get("name", key)),
        elementwise_passes=float(raw["elementwise_passes"]),
        attention_efficiency=float(raw["attention_efficiency"]),
        tp_overlap=float(raw["tp_overlap"]), dp_overlap=float(raw["dp_overlap"]),
        cp_overlap=float(raw["cp_overlap"]), interleaved_pp=bool(raw["interleaved_pp"]),
        context_parallel=bool(raw["context_parallel"]), zero=tuple(int(z) for z in raw["zero"]),
    )


ENGINES_FILE = Path(__file__).with_name("engines.yaml")  # how `forge launch` starts processes on each chip


def engine_data() -> dict:
    """engines.yaml: per chip, the image family, Slurm GPUs, the Kubernetes resource, or why forge
    launch cannot start processes on it; the images; SageMaker's instance types."""
    data: dict = yaml.safe_load(ENGINES_FILE.read_text())
    return data


def forge_runs(stack: str) -> bool:
    """Whether forge's own loop runs `stack` (stacks.yaml `forge_runs`)."""
    return bool(load_stacks().get(stack, {}).get("forge_runs", False))


def launch_stack(stack: str) -> str:
    """The stack `forge launch` runs for a plan on `stack`: itself if forge runs it, else the one its
    `forge_launches` names."""
    return stack if forge_runs(stack) else str(load_stacks().get(stack, {}).get("forge_launches", "fsdp"))
