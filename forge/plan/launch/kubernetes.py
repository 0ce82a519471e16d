"""Kubernetes (also SageMaker HyperPod on EKS): a Kubeflow training-operator `PyTorchJob` manifest,
one pod per node (Master, then Workers), each running torchrun; validated against the CRD's
published OpenAPI schema (pytorchjob.schema.json, vendored from kubeflow/training-operator)."""
from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

import yaml

from forge.errors import ForgeError
from forge.plan.launch.layout import Launch

MANIFEST = "pytorchjob.yaml"
SCHEMA_FILE = Path(__file__).with_name("pytorchjob.schema.json")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def job_name(name: str) -> str:
    """A DNS-1123 label from the recipe name (lowercase, '-' for the rest, at most 63)."""
    label = re.sub(r"[^a-z0-9-]+", "-", f"forge-{name}".lower()).strip("-")[:63].strip("-")
    if not DNS_LABEL.fullmatch(label):
        raise ForgeError(f"cannot make a Kubernetes name from recipe name {name!r}")
    return label


def _container(launch: Launch, image: str, workdir: str, resource: str) -> dict:
    args = ["--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.procs_per_node)]
    if launch.nodes > 1:  # the operator sets MASTER_ADDR, MASTER_PORT and RANK (the pod's node rank)
        args += ["--node-rank", "$(RANK)", "--master-addr", "$(MASTER_ADDR)", "--master-port", "$(MASTER_PORT)"]
    else:
        args = ["--standalone", *args]
    container = {"name": "pytorch", "image": image, "command": ["torchrun"], "args": [*args, *launch.run_args()],
                 "workingDir": workdir, "volumeMounts": [{"name": "work", "mountPath": workdir}]}
    if resource:
        container["resources"] = {"limits": {resource: launch.chips_per_node},
                                  "requests": {resource: launch.chips_per_node}}
    return container


def manifest(launch: Launch, image: str, workdir: str, claim: str, resource: str) -> dict:
    """The PyTorchJob: the recipe and data are read from `workdir`, the volume claim `claim` mounted there."""
    pod = {"spec": {"containers": [_container(launch, image, workdir, resource)],
                    "volumes": [{"name": "work", "persistentVolumeClaim": {"claimName": claim}}]}}
    specs = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(pod)}}
    if launch.nodes > 1:
        specs["Worker"] = {"replicas": launch.nodes - 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(pod)}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": job_name(launch.name), "labels": {"app.kubernetes.io/created-by": "forge"}},
            "spec": {"nprocPerNode": str(launch.procs_per_node), "pytorchReplicaSpecs": specs,
                     "runPolicy": {"cleanPodPolicy": "None"}}}


@functools.lru_cache(maxsize=1)
def crd_schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())["schema"]


def problems(doc: dict) -> list[str]:
    """Where the manifest breaks the CRD's schema (path: message), empty when it conforms."""
    import jsonschema

    validator = jsonschema.Draft7Validator(crd_schema())
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def render(launch: Launch, header: list[str], image: str, workdir: str, claim: str, resource: str) -> dict[str, str]:
    doc = manifest(launch, image, workdir, claim, resource)
    bad = problems(doc)
    if bad:
        raise ForgeError(f"{MANIFEST}: the PyTorchJob does not conform to the CRD schema: {bad[0]}")
    return {MANIFEST: "\n".join(f"# {h}" for h in header) + "\n" + yaml.safe_dump(doc, sort_keys=False)}
