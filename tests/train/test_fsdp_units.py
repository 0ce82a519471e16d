"""The sharded strategy's pieces that need no second process: the training core names no device type
outside its accelerator helper, a resume point of one strategy is refused by the other naming the
strategy to resume with, and the recipe's parallelism block reaches the trainer's options."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from forge.errors import ForgeError
from forge.recipe import Parallelism
from forge.train import checkpoint as files
from forge.train.checkpointer import FullCheckpointer
from forge.train.fsdp import Options, options
from forge.train.sharded import ShardedCheckpointer

FORGE = Path(__file__).resolve().parents[2] / "forge"


class OneProcess:
    is_main_process = True

    def wait_for_everyone(self) -> None:
        pass


def test_the_training_core_names_no_device_outside_its_accelerator_helper():
    found = [f"{p.relative_to(FORGE)}:{i}" for folder in ("train", "stages") for p in sorted((FORGE / folder).glob("*.py"))
             if p.name != "accel.py" for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bcuda\b", line)]
    assert found == []


def resume_point(folder: Path, sharded: bool) -> Path:
    path = folder / "step-0000002"
    path.mkdir(parents=True)
    (path / files.STATE).write_text(json.dumps({"step": 2, "run_id": None}))
    torch.save({"scheduler": {}}, path / files.TRAINING)
    if sharded:
        (path / "dcp").mkdir()
        (path / "dcp" / ".metadata").write_bytes(b"x")
    files.write_manifest(path)
    return path


def test_a_resume_point_of_the_other_strategy_is_refused_naming_it(tmp_path):
    resume_point(tmp_path / "a", sharded=True)
    with pytest.raises(ForgeError, match=r"step-0000002: a sharded resume point \(parallelism.strategy fsdp\); "
                                         r"resume it with parallelism.strategy=fsdp"):
        FullCheckpointer(OneProcess()).latest(tmp_path / "a", None)
    assert ShardedCheckpointer(OneProcess()).latest(tmp_path / "a", None) == tmp_path / "a" / "step-0000002"
    resume_point(tmp_path / "b", sharded=False)
    with pytest.raises(ForgeError, match=r"a whole-model resume point \(parallelism.strategy ddp\); "
                                         r"resume it with parallelism.strategy=ddp"):
        ShardedCheckpointer(OneProcess()).latest(tmp_path / "b", None)


def test_a_damaged_shard_makes_the_sharded_resume_point_unusable(tmp_path):
    path = resume_point(tmp_path, sharded=True)
    (path / "dcp" / ".metadata").write_bytes(b"y")  # the manifest covers every rank's shard files
    assert ShardedCheckpointer(OneProcess()).latest(tmp_path, None) is None


def test_the_parallelism_block_reaches_the_trainer_whole():
    block = Parallelism(strategy="fsdp", sharding="hybrid", mixed_precision="bf16", activation_checkpointing=True,
                        cpu_offload=True)
    assert options(block) == Options("fsdp", "hybrid", "bf16", True, True)
    assert options("ddp") == Options()
    with pytest.raises(ValueError, match="sharding: hybrid needs strategy: fsdp"):
        Parallelism(sharding="hybrid")
