"""Kubernetes (also SageMaker HyperPod on EKS): a Kubeflow training-operator `PyTorchJob` manifest,
one pod per node (Master, then Workers), each running torchrun; validated against the CRD's
published OpenAPI schema (pytorchjob.schema.json, vendored from kubeflow/training-operator)."""
from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.launch.layout import Launch
from forge.launch.quote import yaml_text
from forge.plan.stacks import engine_data

MANIFEST = "pytorchjob.yaml"
SCHEMA_FILE = Path(__file__).with_name("pytorchjob.schema.json")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # a PVC's name
# an image reference as the container runtimes parse it (distribution/reference's grammar):
# [host[:port]/]path[:tag][@digest], path components lowercase
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(rf"(?P<name>(?:{_HOST}/)?{_PART}(?:/{_PART})*)(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?")


def job_name(name: str) -> str:
    """A DNS-1123 label from the recipe name (lowercase, '-' for the rest, at most 63)."""
    label = re.sub(r"[^a-z0-9-]+", "-", f"forge-{name}".lower()).strip("-")[:63].strip("-")
    if not DNS_LABEL.fullmatch(label):
        raise ForgeError(f"cannot make a Kubernetes name from recipe name {name!r}")
    return label


def check_names(image: str, workdir: str, claim: str) -> None:
    """The image, mount path and volume claim as Kubernetes takes them, else a ForgeError naming the flag."""
    ref = IMAGE.fullmatch(image)
    if ref is None or len(ref["name"]) > 255:
        raise ForgeError(f"--image {image!r}: not a container image reference ([HOST[:PORT]/]PATH[:TAG][@DIGEST], "
                         "the path in lowercase)")
    if not workdir.startswith("/") or not workdir.isprintable():
        raise ForgeError(f"--workdir {workdir!r}: the pods' mount path must be an absolute path on one line")
    if len(claim) > 253 or not DNS_SUBDOMAIN.fullmatch(claim):
        raise ForgeError(f"--volume-claim {claim!r}: not a Kubernetes object name (lowercase letters, digits, "
                         "'-' and '.', at most 253)")


def _args(words: list[str]) -> list[str]:
    """Kubernetes expands $(VAR) in a container's args and reads $$ as one $: every $ of a value
    is doubled so that it reaches torchrun as written."""
    return [w.replace("$", "$$") for w in words]


def _container(launch: Launch, image: str, workdir: str, resource: str) -> dict:
    args = ["--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.procs_per_node)]
    if launch.nodes > 1:  # the operator sets MASTER_ADDR, MASTER_PORT and RANK (the pod's node rank)
        args += ["--node-rank", "$(RANK)", "--master-addr", "$(MASTER_ADDR)", "--master-port", "$(MASTER_PORT)"]
    else:
        args = ["--standalone", *args]
    container = {"name": "pytorch", "image": image, "command": ["torchrun"], "args": [*args, *_args(launch.run_args())],
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
    check_names(image, workdir, claim)
    doc = manifest(launch, image, workdir, claim, resource)
    bad = problems(doc)
    if bad:
        raise ForgeError(f"{MANIFEST}: the PyTorchJob does not conform to the CRD schema: {bad[0]}")
    return {MANIFEST: yaml_text(doc, header, MANIFEST)}


def rendered(args: Any, launch: Launch, recipe: Any, header: list[str]) -> tuple[dict[str, str], None]:
    """The engine table's entry (forge.launch.engines): the target's DLC unless --image names one."""
    info = engine_data()["chips"][launch.chip]
    default = engine_data()["images"][info["image"]].format(region=args.region)
    image = args.image if args.image is not None else default   # an empty --image is refused, not defaulted
    return render(launch, header, image, args.workdir, args.volume_claim, info["k8s_resource"]), None
