"""Stages: each takes (input checkpoint, data, settings) and returns an output checkpoint + metrics."""
from __future__ import annotations

import importlib

KINDS = {"pretrain": "forge.stages.pretrain"}


def runner(kind: str):
    """The `run` function of a stage kind (imported on demand)."""
    return importlib.import_module(KINDS[kind]).run
