"""A short measurement of this machine: a few training steps (forward, backward, clipping, AdamW)
of a stage's model, built with random weights from its config, at the stage's micro-batch shape on
the device training uses. What forge.plan.local_rate turns into the local target's rate for that
stage. The only module of forge/plan that runs a model (torch and transformers load here, late)."""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from forge.plan.flops import training_flops_per_token
from forge.plan.memory import memory_per_chip
from forge.plan.model import count_parameters, spec_from_config
from forge.plan.parallel import Layout

MAX_MICRO_FLOPS = 2e12   # a measured micro-step beyond this would take many seconds here: fewer sequences
MAX_RAM_SHARE = 0.25     # the measurement's training states and activations: at most this share of RAM
BUDGET_S = 4.0           # timed steps stop after this many seconds (at least one is timed)
STEPS = 3                # timed steps at most, after one untimed warm-up step


@dataclass(frozen=True)
class Shape:
    """One stage's step: micro-batches of `sequences` of `seq_len` tokens, `accum` of them per
    optimizer step, at `precision`."""

    seq_len: int
    sequences: int
    accum: int
    precision: str


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What the measured rate depends on besides the shape, read without loading torch (a plan
    that finds its measurement cached stays quick): host, CPU model and the cores this process
    may use, GPUs visible, torch's version."""
    try:
        from importlib.metadata import version

        torch_version = version("torch")
    except Exception:  # noqa: BLE001 (no metadata: an unusual install; the key still names the rest)
        torch_version = "?"
    nvidia = Path("/proc/driver/nvidia/gpus")
    gpus = sorted(p.name for p in nvidia.glob("*")) if nvidia.is_dir() else []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"host": platform.node(), "cpu": cpu_model(), "cores": cores, "torch": torch_version,
            "gpus": f"{len(gpus)} ({os.environ.get('CUDA_VISIBLE_DEVICES', 'all')} visible)" if gpus else "none"}


def too_big(config: dict, shape: Shape) -> str:
    """Why a measurement of this shape should not run here ('' when it can)."""
    from forge.plan.hardware import physical_memory_bytes

    spec = spec_from_config(config)
    mem = memory_per_chip(spec, count_parameters(spec), Layout(micro_batch=1), shape.seq_len, shape.precision,
                          flash=True)
    if mem.total > MAX_RAM_SHARE * physical_memory_bytes():
        return f"{mem.total / 2**30:.1f} GiB to train one sequence, too much to measure here in passing"
    if training_flops_per_token(spec, shape.seq_len) * shape.seq_len > MAX_MICRO_FLOPS:
        return "one sequence's training step is too large to measure here in a few seconds"
    return ""


def measure(config: dict, shape: Shape) -> dict:
    """Seconds of one optimizer step at `shape` on this machine: {step_time_s, micro_s, optimizer_s,
    measured_sequences, timed_steps, device}. Micro-batches too large to time quickly are measured with
    fewer sequences and scaled (the step's work is linear in them)."""
    import torch

    spec = spec_from_config(config)
    per_seq = training_flops_per_token(spec, shape.seq_len) * shape.seq_len
    n = max(1, min(shape.sequences, int(MAX_MICRO_FLOPS // max(per_seq, 1.0))))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        micro, opt, device = _timed_steps(config, shape, n)
    micro_s = statistics.median(micro) * shape.sequences / n
    opt_s = statistics.median(opt)
    return {"step_time_s": shape.accum * micro_s + opt_s, "micro_s": micro_s, "optimizer_s": opt_s,
            "measured_sequences": n, "timed_steps": len(micro), "device": device}


def _timed_steps(config: dict, shape: Shape, n: int) -> tuple[list[float], list[float], str]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_config(cfg).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    vocab = int(getattr(cfg, "vocab_size", 0) or 256)
    ids = torch.randint(0, vocab, (n, shape.seq_len), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=shape.precision in ("bf16", "fp16"))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    micro, opt_times, started = [], [], time.perf_counter()
    for i in range(STEPS + 1):
        t0 = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        sync()
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i:  # the first step allocates and warms the kernels up
            micro.append(t1 - t0)
            opt_times.append(time.perf_counter() - t1)
            if time.perf_counter() - started > BUDGET_S:
                break
    del model, opt
    return micro, opt_times, str(device) + (f" ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else
                                            f" ({torch.get_num_threads()} threads)")
