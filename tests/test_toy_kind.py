"""A stage kind added from inside a test, touching no other file: a settings class (a StageSettings
with `kind: Literal["toy"]`, which the recipe then accepts), a stage (`run` below, on the shared
loop forge.train.loop.fit) and a row of the kinds table. It goes through `forge run`, `forge plan`
and `forge eval` like the built-in kinds."""
from __future__ import annotations

import json
from typing import ClassVar, Literal

import pytest
from pydantic import Field
from safetensors.torch import load_file

from forge import cli
from forge.data.mixing import build_mixture
from forge.kinds import KINDS, Kind
from forge.lm.perplexity import loss_metrics, source_blocks, source_losses
from forge.recipe import SETTINGS, TrainSettings, load_recipe
from forge.train.loop import fit
from forge.train.losses import causal_lm_loss
from forge.train.session import open_session
from forge.train.task import Outcome, Task
from forge_testing import base_recipe, write_recipe


class ToyTask(Task):
    """The toy kind's part of the loop: causal-LM loss on packed blocks of its plain-text sources in
    equal shares, held-out loss per source."""

    def __init__(self, stage, s, inputs):
        self.stage, self.s = stage, s
        self.mix = build_mixture(inputs.sources, stage.sources, s.tokenizer, stage.seq_len, "eos")
        super().__init__(self.mix)
        self.held_out = source_blocks(inputs.sources, stage.sources, s.tokenizer, stage.seq_len, "eos",
                                      stage.eval.max_blocks)
        self.evaluates = bool(self.held_out)

    def batches(self):
        return [self.mix.next_batch(self.stage.batch_size, self.s.rank, self.s.world)
                for _ in range(self.stage.grad_accum)]

    def loss(self, model, batch):
        return causal_lm_loss(model, batch)

    def tokens(self, batches):
        return sum(b.numel() for b in batches)

    def evaluate(self, step):
        return loss_metrics(source_losses(self.s.model, self.held_out, self.stage.batch_size, self.s.device))

    def finish(self, state):
        return Outcome({"toy_steps": float(state.step)}, dict(self.mix.taken))


def run(stage, inputs):
    """The toy stage (a Task subclass on the shared loop)."""
    s = open_session(stage, inputs)
    return fit(s, ToyTask(stage, s, inputs), inputs.tracker)


@pytest.fixture
def toy_kind(monkeypatch):
    class ToyStage(TrainSettings):
        """A toy kind: causal-LM training on plain-text sources."""

        kind: Literal["toy"]
        reads: ClassVar[str] = "text"
        evaluates: ClassVar[tuple[str, ...]] = ("perplexity",)
        data: list[str] = Field(min_length=1)

        @property
        def sources(self) -> dict[str, float]:
            return {name: 1.0 for name in self.data}

        def source_paths(self) -> dict[str, str]:
            return {name: f"data[{j}]" for j, name in enumerate(self.data)}

    monkeypatch.setitem(KINDS, "toy", Kind(ToyStage, __name__, "forge.plan.workloads:LM"))
    yield ToyStage
    SETTINGS.pop("toy", None)  # defining the class registered it with the recipe schema


def _toy(name: str, **kw) -> dict:
    return {"name": name, "kind": "toy", "data": ["domain"], "max_steps": 6, "seq_len": 32, "batch_size": 4,
            "optim": {"lr": 3e-3}, "schedule": {"kind": "constant"}, "eval": {"max_blocks": 4}, **kw}


def _toy_recipe(tmp_path, *stages: dict):
    return write_recipe(tmp_path / "toy.yaml", base_recipe(tmp_path, stages=list(stages or [_toy("toy1")])))


@pytest.mark.slow
def test_a_toy_kind_runs_plans_and_evaluates(toy_kind, tmp_path, capsys):
    path = _toy_recipe(tmp_path, _toy("toy1"), _toy("toy2", data=["general"], max_steps=2))
    recipe = load_recipe(path)
    assert all(isinstance(s, toy_kind) for s in recipe.stages)

    assert cli.main(["plan", str(path), "--target", "trn3"]) == 0
    plan = capsys.readouterr().out
    assert "Stage 'toy1' (toy)" in plan and "Stage 'toy2' (toy)" in plan

    assert cli.main(["run", str(path)]) == 0
    out = tmp_path / "out"
    final = out / "stages" / "toy1" / "final"
    lineage = json.loads((out / "novella" / "lineage.json").read_text())
    record, second = lineage["stages"]
    assert second["input_checkpoint"] == record["output_checkpoint"] == str(final)
    assert record["kind"] == "toy" and record["steps"] == 6 and record["metrics"]["toy_steps"] == 6
    assert record["tokens_by_source"]["domain"] == 6 * 4 * 32
    trained = load_file(final / "model.safetensors")
    start = load_file(f"{lineage['base']['checkpoint']}/model.safetensors")
    assert any(not trained[k].equal(start[k]) for k in start)  # the toy loop trained the weights

    capsys.readouterr()
    report = tmp_path / "eval.json"
    assert cli.main(["eval", str(path), "--json", str(report)]) == 0
    comparison = json.loads(report.read_text())
    figures = {m["label"]: m["metrics"] for m in comparison["models"]}
    assert list(figures) == ["start", "toy1", "novella"]
    assert figures["toy1"]["ppl.domain"] < figures["start"]["ppl.domain"]  # it trained on domain
    assert {"ppl.general", "retention.general", "domain_gain.domain"} <= set(figures["novella"])


def test_forge_plan_stage_asks_the_row(toy_kind, tiny_checkpoint, capsys):
    assert cli.main(["plan", "--model", str(tiny_checkpoint), "--stage", "toy", "--tokens", "1M",
                     "--seq-len", "64", "--target", "trn3"]) == 0
    assert "(toy)" in capsys.readouterr().out


def test_a_toy_kind_is_validated_like_the_others(toy_kind, tmp_path):
    from forge.errors import ForgeError

    with pytest.raises(ForgeError, match=r"stages\[0\]\.data\[0\]: unknown data source 'nope'"):
        load_recipe(_toy_recipe(tmp_path, _toy("toy1", data=["nope"])))
    with pytest.raises(ForgeError, match=r"stages\[0\]\.seq_len: .*greater than or equal to 8"):
        load_recipe(_toy_recipe(tmp_path, _toy("toy1", seq_len=2)))
