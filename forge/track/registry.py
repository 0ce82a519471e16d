"""The model registry: a Novella logged as an MLflow transformers model and registered, its
aliases, version tags and descriptions (forge.track.MlflowTracker calls these on rank 0)."""
from __future__ import annotations

import logging
import os

TEXT_LIMIT = 5000  # MLflow's longest tag value and model (version) description


def register_model(model_dir: str | os.PathLike[str], name: str, alias: str, tags: dict[str, str]) -> int:
    import mlflow
    import mlflow.transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    os.environ["HF_HUB_OFFLINE"] = "1"  # MLflow looks up a model card on the hub; a local model has none
    logging.getLogger("mlflow.transformers").setLevel(logging.ERROR)  # ...and warns that it found none
    info = mlflow.transformers.log_model(
        {"model": model, "tokenizer": tokenizer}, name="novella", task="text-generation",
        registered_model_name=name, tags=tags, pip_requirements=requirements(),
    )
    version = int(info.registered_model_version)
    set_alias(name, alias, version)
    set_version_tags(name, version, tags)
    return version


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
