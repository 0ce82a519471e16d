"""Slurm (also SageMaker HyperPod's Slurm clusters): an `sbatch` script that starts one torchrun per
node with `srun`, meeting at a c10d rendezvous on the job's first node."""
from __future__ import annotations

from forge.plan.launch.layout import PORT, Launch
from forge.plan.launch.torchrun import shell_word

SCRIPT = "forge.sbatch"


def sbatch(launch: Launch, header: list[str], gpus: bool) -> str:
    """The script; `gpus`: ask Slurm for the chips as GPUs (--gpus-per-node), else whole nodes."""
    torchrun = ["torchrun", "--nnodes", "$SLURM_NNODES", "--nproc-per-node", str(launch.procs_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"$HEAD:{PORT}", "--rdzv-id", "$SLURM_JOB_ID",
                *launch.run_args()]
    words = " ".join(f'"{w}"' if w.startswith("$") else shell_word(w) for w in torchrun)
    lines = ["#!/bin/bash", f"#SBATCH --job-name=forge-{launch.name}", f"#SBATCH --nodes={launch.nodes}",
             "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --output=forge-%j.out"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={launch.chips_per_node}")
    lines += [*[f"# {h}" for h in header],
              "# submit from the directory that holds the recipe path (a file system every node sees): sbatch "
              + SCRIPT, "set -euo pipefail",
              'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"srun --ntasks-per-node=1 {words}", ""]
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
            words = line.split()
            out["nproc_per_node"] = int(words[words.index("--nproc-per-node") + 1].strip('"'))
            out["args"] = [w.strip("'\"") for w in words[words.index("-m"):]]
    return out
