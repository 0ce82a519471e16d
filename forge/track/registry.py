"""The model registry: a Novella logged as an MLflow transformers model and registered, its
aliases, version tags and descriptions (forge.track.MlflowTracker calls these on rank 0).

A version shows a handful of tags (SHOWN_TAGS: base, stages, gates, the primary metric and its
value, which the alias decision reads back); the rest (data hashes, each gate's figures, compute
planned vs measured, the plan) go to one JSON artifact of the registering run,
`registry/version-<n>.json` (details_path), not a wall of truncated tags."""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

TEXT_LIMIT = 5000  # MLflow's longest tag value and model (version) description
SHOWN_TAGS = ("forge.base", "forge.stages", "forge.gates", "forge.primary_metric", "forge.primary_value")
CANDIDATE = "candidate"  # the alias every version forge registers takes (a Novella's, a served checkpoint's)


def details_path(version: int | str) -> str:
    """The registering run's artifact that holds a version's details."""
    return f"registry/version-{version}.json"


def split_tags(tags: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """(the version's tags, its details): the SHOWN_TAGS, and the rest without the `forge.` prefix,
    grouped by their first part (`forge.compute.domain.steps` -> details["compute"]["domain.steps"])."""
    shown = {k: v for k, v in tags.items() if k in SHOWN_TAGS}
    details: dict[str, Any] = {}
    for key, value in tags.items():
        if key in shown:
            continue
        head, _, rest = key.removeprefix("forge.").partition(".")
        if rest:
            details.setdefault(head, {})[rest] = value
        else:
            details[head] = value
    return shown, details


def register_model(model_dir: str | os.PathLike[str], name: str, alias: str, tags: dict[str, str],
                   files: tuple[str, ...] = ()) -> int:
    """Log the folder's model and tokenizer on the active run, register them as a new version of
    `name` with `alias`; `files` of the folder (lineage.json) are logged among the model's own files,
    where `fetch_registered_model` finds them for this version (a run may register several)."""
    import mlflow
    import mlflow.transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    os.environ["HF_HUB_OFFLINE"] = "1"  # MLflow looks up a model card on the hub; a local model has none
    logging.getLogger("mlflow.transformers").setLevel(logging.ERROR)  # ...and warns that it found none
    shown, details = split_tags(tags)
    info = mlflow.transformers.log_model(
        {"model": model, "tokenizer": tokenizer}, name="novella", task="text-generation",
        tags=shown, pip_requirements=requirements(),
    )
    for file in files:  # before the version exists, so that no reader of it finds the model without them
        mlflow.MlflowClient().log_model_artifact(info.model_id, str(Path(model_dir) / file))
    version = int(mlflow.register_model(info.model_uri, name).version)  # the logged model (models:/m-...)
    set_alias(name, alias, version)
    set_version_tags(name, version, shown)
    mlflow.log_dict({"model": name, "version": version, **details}, details_path(version))
    return version


def version_details(name: str, version: int | str) -> dict[str, Any]:
    """A registered version's details (details_path on the run that registered it); {} if none."""
    import mlflow

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mv = mlflow.MlflowClient().get_model_version(name, str(version))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=mv.run_id, artifact_path=details_path(version),
                                                       dst_path=tmp)
        except mlflow.exceptions.MlflowException:
            return {}
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
    return data


def describe_model(name: str, version: int, markdown: str, model_markdown: str | None = None) -> None:
    import mlflow

    client = mlflow.MlflowClient()
    client.update_model_version(name, str(version), description=markdown[:TEXT_LIMIT])
    if not client.get_registered_model(name).description:
        client.update_registered_model(name, description=(model_markdown or markdown)[:TEXT_LIMIT])


def alias_version(name: str, alias: str) -> tuple[int, dict[str, str]] | None:
    import mlflow

    try:
        mv = mlflow.MlflowClient().get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        return None
    return int(mv.version), dict(mv.tags)


def set_alias(name: str, alias: str, version: int) -> None:
    import mlflow

    mlflow.MlflowClient().set_registered_model_alias(name, alias, str(version))


def set_version_tags(name: str, version: int, tags: dict[str, str]) -> None:
    import mlflow

    client = mlflow.MlflowClient()
    for k, v in tags.items():
        client.set_model_version_tag(name, str(version), k, str(v)[:TEXT_LIMIT])


def requirements() -> list[str]:
    """Pinned runtime needs of a logged model (MLflow's own guess imports torchvision, which forge lacks)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("torch", "transformers", "tokenizers", "safetensors", "accelerate"):
        try:
            out.append(f"{pkg}=={version(pkg).split('+')[0]}")
        except PackageNotFoundError:
            pass
    return out
