"""Checkpoint souping: the stage's output is the (weighted) average of named earlier stages'
outputs or checkpoint folders. No training; it fails clearly when shapes or architectures differ."""
from __future__ import annotations

import json
from pathlib import Path

from forge.recipe.settings import SoupStage
from forge.rundir import FINAL
from forge.stages.result import StageInputs, StageResult
from forge.train.accel import process_state
from forge.train.checkpoint import STATE
from forge.train.parallel import checkpointer


def run(stage: SoupStage, inputs: StageInputs) -> StageResult:
    folders = [inputs.outputs.get(name) or Path(name) for name in stage.ingredients]
    weights = stage.weights or [1.0] * len(folders)
    final = inputs.out_dir / FINAL
    result = StageResult(final, {"ingredients": float(len(folders))}, lineage={
        "ingredients": [str(f) for f in folders], "weights": [w / sum(weights) for w in weights]})
    checkpointer(inputs.parallelism, process_state()).average(
        folders, weights, final, {STATE: json.dumps({"result": result.as_dict()}, indent=2)})
    return result
