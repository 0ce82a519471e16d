"""What every route reaches: the config, the keys, the registry of sessions, models and samplers,
the worker, the checkpoint store and the sampling hosts; and the release of ended sessions."""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import Request

from forge.serve.checkpoints import Store
from forge.serve.config import ServeConfig
from forge.serve.sampling import Hosts
from forge.serve.state import ModelEntry, Registry
from forge.serve.worker import Reply, Worker


@dataclass
class Served:
    cfg: ServeConfig
    keys: frozenset[str]
    registry: Registry
    worker: Worker
    workdir: Path
    capabilities: list[dict[str, Any]]
    store: Store
    hosts: Hosts


def owner(request: Request) -> str:
    """The fingerprint of the request's API key (set by the key check in front of every route)."""
    found: str = request.state.owner
    return found


def release(served: Served, entries: list[ModelEntry]) -> None:
    """Free ended sessions' models, after the calls already queued for them, and end their MLflow runs."""
    for entry in entries:
        def drop(entry: ModelEntry = entry) -> Reply:
            entry.served = None
            if entry.tracking is not None:
                entry.tracking.close(wait=False)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return {}

        served.worker.submit(f"release {entry.id}", drop, lane=entry.session_id)
