"""Launch engines: the ONE table of the engines `forge launch` writes jobs for. A row is an `Engine`:
its name, one line of help, the flags it adds (in its own group of `forge launch --help`), how it
renders the job's files from a `Launch`, and, for an engine forge can start jobs on itself, how it
submits them. The CLI reads --engine's choices, the help and the refusals from this table.

Adding an engine is one module with a `render` and one row below (a test can add a row to ENGINES
from inside itself: tests/launch/test_toy_engine.py). Modules are dotted names, imported on demand.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

Files = dict[str, str]          # file name in the job folder -> its text
Rendered = tuple[Files, Any]    # the files, and what `submit` needs (None: nothing to submit)


def _no_flags(group: Any) -> None:
    return None


@dataclass(frozen=True)
class Engine:
    name: str
    summary: str                 # one line for `forge launch --help`
    render: str                  # "module:function" (args, launch, recipe, header) -> Rendered
    flags: Callable[[Any], None] = _no_flags  # adds the engine's own flags to its argparse group
    cluster: bool = True         # runs on a cluster: refuses --target local
    submit: str | None = None    # "module:function" (args, launch, recipe, job, out) -> what was started

    def rendered(self, args: argparse.Namespace, launch: Any, recipe: Any, header: list[str]) -> Rendered:
        result: Rendered = _resolve(self.render)(args, launch, recipe, header)
        return result

    def submitted(self, args: argparse.Namespace, launch: Any, recipe: Any, job: Any, out: Path) -> str:
        if self.submit is None:
            raise ValueError(f"engine {self.name} starts no jobs itself")
        return str(_resolve(self.submit)(args, launch, recipe, job, out))


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


def _kubernetes_flags(group: Any) -> None:
    group.add_argument("--workdir", default="/workspace", help="where the pods see the checkout and data")
    group.add_argument("--volume-claim", default="forge-work", help="the PVC mounted at --workdir")


def _sagemaker_flags(group: Any) -> None:
    group.add_argument("--s3", help="s3://BUCKET/PREFIX for the channels, output and checkpoints")
    group.add_argument("--role-arn", help="the job's execution role")
    group.add_argument("--job-name", help="the training job's name (default: forge-RECIPE-TIME)")
    group.add_argument("--instance-type", help="override the ml.* instance type")
    group.add_argument("--part-size-mb", type=int, default=64,
                       help="--submit: files above this size are uploaded in parts of this size (5..5120)")


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("torchrun", "a torchrun script per node and the accelerate config of the same topology",
           "forge.launch.torchrun:rendered", cluster=False),
    Engine("slurm", "an sbatch script: srun starts torchrun on every node", "forge.launch.slurm:rendered"),
    Engine("kubernetes", "a Kubeflow PyTorchJob manifest, checked against the CRD's schema",
           "forge.launch.kubernetes:rendered", _kubernetes_flags),
    Engine("sagemaker", "a SageMaker training job request and its entry script; --submit starts it (boto3)",
           "forge.launch.sagemaker:rendered", _sagemaker_flags, submit="forge.launch.sagemaker:submitted"),
)}
