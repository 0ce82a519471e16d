"""Local machines and bare clusters: the `torchrun` command each node runs, as a script, and the
accelerate config of the same topology (for `accelerate launch --config_file`)."""
from __future__ import annotations

import shlex
from typing import Any

from forge.launch.layout import PORT, Launch
from forge.launch.quote import Live, comments, shell_line, yaml_text

SCRIPT = "torchrun.sh"
ACCELERATE = "accelerate.yaml"


# the node's rank and node 0's address come from the environment of the node that runs the script
NODE_RANK = Live("${NODE_RANK:-0}")
ENDPOINT = Live(f"${{MASTER_ADDR:-127.0.0.1}}:{PORT}")


def torchrun_args(launch: Launch) -> list[str]:
    """torchrun's arguments for the launch: one process per rank on each node; several nodes meet
    at a c10d rendezvous on the head node."""
    args = ["--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.procs_per_node)]
    if launch.nodes == 1:
        return ["--standalone", *args]
    return [*args, "--node-rank", NODE_RANK, "--rdzv-backend", "c10d", "--rdzv-endpoint", ENDPOINT,
            "--rdzv-id", f"forge-{launch.name}"]


def command_line(launch: Launch) -> str:
    return shell_line(["torchrun", *torchrun_args(launch), *launch.run_args()])


def script(launch: Launch, header: list[str]) -> str:
    lines = ["#!/usr/bin/env bash", *comments(header)]
    if launch.nodes > 1:
        lines += [f"# run on each of the {launch.nodes} nodes, from the directory that holds the recipe path, with",
                  f"#   NODE_RANK=0..N-1 and MASTER_ADDR=<node 0's address> (port {PORT})"]
    else:
        lines += ["# run from the directory that holds the recipe path"]
    lines += ["set -euo pipefail", f"exec {command_line(launch)}", ""]
    return "\n".join(lines)


def accelerate_config(launch: Launch) -> dict:
    """accelerate's config file for the same machines and processes. forge chooses its parallelism
    from the recipe (parallelism.strategy in the command), so the config sets the topology only."""
    cpu = launch.backend == "gloo"
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": ("MULTI_CPU" if cpu else "MULTI_GPU") if launch.world > 1 else "NO",
        "num_machines": launch.nodes,
        "num_processes": launch.world,
        "machine_rank": 0,
        "main_process_ip": "127.0.0.1" if launch.nodes == 1 else "MASTER_ADDR",
        "main_process_port": PORT,
        "rdzv_backend": "static" if launch.nodes == 1 else "c10d",
        "same_network": True,
        "mixed_precision": "no",
        "use_cpu": cpu,
        "gpu_ids": "all",
        "downcast_bf16": "no",
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }


def render(launch: Launch, header: list[str]) -> dict[str, str]:
    notes = [*header, *(["machine_rank: set per node (0..N-1); main_process_ip: node 0's address"]
                        if launch.nodes > 1 else []),
             f"accelerate launch --config_file {ACCELERATE} {shlex.join(launch.run_args())}"]
    return {SCRIPT: script(launch, header), ACCELERATE: yaml_text(accelerate_config(launch), notes, ACCELERATE)}


def rendered(args: Any, launch: Launch, recipe: Any, header: list[str]) -> tuple[dict[str, str], None]:
    """The engine table's entry (forge.launch.engines)."""
    return render(launch, header), None
