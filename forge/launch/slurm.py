"""Slurm (also SageMaker HyperPod's Slurm clusters): an `sbatch` script that starts one torchrun per
node with `srun`, meeting at a c10d rendezvous on the job's first node."""
from __future__ import annotations

import re
import shlex
from typing import Any

from forge.launch.layout import PORT, Launch
from forge.launch.quote import Live, comments, shell_line
from forge.plan.stacks import engine_data

SCRIPT = "forge.sbatch"


def sbatch(launch: Launch, header: list[str], gpus: bool) -> str:
    """The script; `gpus`: ask Slurm for the chips as GPUs (--gpus-per-node), else whole nodes."""
    torchrun = ["torchrun", "--nnodes", Live("$SLURM_NNODES"), "--nproc-per-node", str(launch.procs_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", Live(f"$HEAD:{PORT}"), "--rdzv-id", Live("$SLURM_JOB_ID"),
                *launch.run_args()]
    # sbatch reads #SBATCH lines word by word: the job name keeps only characters that cannot split one
    job = re.sub(r"[^A-Za-z0-9._-]+", "-", f"forge-{launch.name}")
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", f"#SBATCH --nodes={launch.nodes}",
             "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --output=forge-%j.out"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={launch.chips_per_node}")
    lines += [*comments(header),
              "# submit from the directory that holds the recipe path (a file system every node sees): sbatch "
              + SCRIPT, "set -euo pipefail",
              'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"srun --ntasks-per-node=1 {shell_line(torchrun)}", ""]
    return "\n".join(lines)


def render(launch: Launch, header: list[str], gpus: bool) -> dict[str, str]:
    return {SCRIPT: sbatch(launch, header, gpus)}


def parse(text: str) -> dict:
    """What a script asks of Slurm and torchrun (for checks): nodes, gpus per node, processes per node."""
    out: dict = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --nodes="):
            out["nodes"] = int(line.split("=", 1)[1])
        if line.startswith("#SBATCH --gpus-per-node="):
            out["gpus_per_node"] = int(line.split("=", 1)[1])
        if line.startswith("srun "):
            words = shlex.split(line)
            out["nproc_per_node"] = int(words[words.index("--nproc-per-node") + 1])
            out["args"] = words[words.index("-m"):]
    return out


def rendered(args: Any, launch: Launch, recipe: Any, header: list[str]) -> tuple[dict[str, str], None]:
    """The engine table's entry (forge.launch.engines): GPUs asked per node where the chip has them."""
    return render(launch, header, bool(engine_data()["chips"][launch.chip]["slurm_gpus"])), None
