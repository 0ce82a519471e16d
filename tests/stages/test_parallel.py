"""The parallelism seam: the recipe's `parallelism.strategy` names a strategy of forge.train.parallel
(ddp, fsdp), an unknown one is refused naming the allowed values, and every save goes through
the strategy's checkpointer (a stand-in class sees the stage's resume points and output)."""
from __future__ import annotations

import typing

import pytest

from forge.errors import ForgeError
from forge.recipe import Parallelism, PretrainStage, load_recipe
from forge.train import parallel
from forge.train.checkpointer import FullCheckpointer
from forge_testing import base_recipe, pretrain_stage, run_stage, write_recipe


def test_the_recipe_accepts_the_strategies_the_trainer_has():
    allowed = typing.get_args(Parallelism.model_fields["strategy"].annotation)
    assert allowed == tuple(parallel.STRATEGIES)


def test_an_unknown_strategy_is_refused_naming_the_field_and_the_allowed_values(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    assert load_recipe(path).parallelism.strategy == "ddp"
    assert load_recipe(path, ["parallelism.strategy=fsdp"]).parallelism.strategy == "fsdp"
    with pytest.raises(ForgeError, match=r"parallelism\.strategy: Input should be 'ddp' or 'fsdp' \(given: 'zero3'\)"):
        load_recipe(path, ["parallelism.strategy=zero3"])
    with pytest.raises(ForgeError, match="'zero3' is not a parallelism strategy; allowed: ddp, fsdp"):
        parallel.strategy("zero3")
    with pytest.raises(ForgeError, match=r"parallelism: .*cpu_offload: True needs strategy: fsdp"):
        load_recipe(path, ["parallelism.cpu_offload=true"])


def test_every_save_of_a_stage_goes_through_the_strategys_checkpointer(tmp_path, monkeypatch, tiny_checkpoint,
                                                                        generated_sources):
    seen = []

    class Counting(FullCheckpointer):
        def save_resumable(self, model, tokenizer, path, state, keep_last):
            seen.append(("resumable", path.name))
            return super().save_resumable(model, tokenizer, path, state, keep_last)

        def save_final(self, model, tokenizer, path, state, final):
            seen.append(("final", path.name))
            return super().save_final(model, tokenizer, path, state, final)

    ddp = parallel.STRATEGIES["ddp"]
    monkeypatch.setitem(parallel.STRATEGIES, "ddp", parallel.Strategy(ddp.prepare, Counting))
    stage = PretrainStage(**pretrain_stage(max_steps=4, checkpoint={"every": 2}))
    result = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path)
    assert seen == [("resumable", "step-0000002"), ("final", "final")]
    assert (result.checkpoint / "model.safetensors").is_file()
