"""`eval.after_each_stage`: each stage's output is evaluated when the stage ends, its figures in
that stage's MLflow run before the next stage's run starts (and not logged twice), in lineage and
the model card; the mean reward of an rft recipe gates the alias; `--resume` reuses the evaluation
of a stage that finished before the crash."""
from __future__ import annotations

import json
import time

import mlflow
import pytest

from forge import cli
from forge.track import version_details
from forge_testing import base_recipe, crash_after, pretrain_stage, write_recipe

pytestmark = pytest.mark.slow

REWARD = "def e_share(prompts, completions, **fields):\n" \
         "    return [sum(ch == 'e' for ch in c) / max(1, len(c)) for c in completions]\n"


def _runs(tmp, out) -> tuple[mlflow.MlflowClient, dict[str, str]]:
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    return mlflow.MlflowClient(), json.loads((out / "tracking.json").read_text())["stages"]


def _suite_logs(monkeypatch) -> list[tuple[str, float]]:
    """(run id, time in ms) of every `suite` summary the tracker writes."""
    from forge.track import MlflowTracker

    calls, real = [], MlflowTracker.log_summary

    def spy(self, section, values, run_id=None):
        if section == "suite":
            calls.append((run_id, time.time() * 1000))
        return real(self, section, values, run_id=run_id)

    monkeypatch.setattr(MlflowTracker, "log_summary", spy)
    return calls


def test_each_stage_is_evaluated_when_it_ends_and_the_mean_reward_gates_the_alias(tmp_path, monkeypatch):
    logged = _suite_logs(monkeypatch)
    (tmp_path / "rewards.py").write_text(REWARD)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say something about {i}."}) + "\n" for i in range(24)))
    recipe = base_recipe(tmp_path, stages=[
        pretrain_stage("one", max_steps=2, eval={"max_blocks": 2}),
        {"name": "rl", "kind": "rft", "data": ["p"], "rewards": [{"source": "rewards.py:e_share"}], "max_steps": 2,
         "seq_len": 64, "batch_size": 2, "group": 2, "max_new_tokens": 6, "optim": {"lr": 1e-3}},
    ], eval={"max_blocks": 2, "seq_len": 32, "after_each_stage": True, "reward": {"limit": 4},
             "gates": {"reward_mean_min": 0.99}},
       tracking={"uri": f"sqlite:///{tmp_path}/mlflow.db"})
    recipe["data"]["p"] = {"path": str(prompts), "holdout": 0.3}
    assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0  # a failed gate: 0 without --strict

    out = tmp_path / "out"
    client, stages = _runs(tmp_path, out)
    one, rl = client.get_run(stages["one"]), client.get_run(stages["rl"])
    for run in (one, rl):
        assert {"suite.ppl.general", "suite.retention.general", "suite.reward.mean", "suite.reward.e_share.mean"} \
            <= set(run.data.params)
    # stage one's figures were written when it ended: before stage rl's run started; once only
    first = [t for run_id, t in logged if run_id == one.info.run_id]
    assert len(first) == 1 and one.info.end_time <= first[0] < rl.info.start_time
    late = [t for run_id, t in logged if run_id == rl.info.run_id]
    assert len(late) == 1 and late[0] >= rl.info.end_time

    lineage = json.loads((out / "novella" / "lineage.json").read_text())
    figure = float(one.data.params["suite.reward.mean"])  # params hold 4 significant digits
    assert lineage["stages"][0]["evaluation"]["reward.mean"] == pytest.approx(figure, rel=1e-3)
    ev = lineage["evaluation"]
    assert [m["label"] for m in ev["models"]] == ["start", "one", "novella"]
    # the Novella is the rl stage's weights: its figures are the ones measured when rl ended
    assert ev["models"][2]["metrics"]["reward.mean"] == pytest.approx(float(rl.data.params["suite.reward.mean"]),
                                                                      rel=1e-3)
    assert not ev["passed"] and ev["gates"][0]["metric"] == "reward.mean"
    card = (out / "novella" / "MODEL_CARD.md").read_text()
    assert "| reward.mean |" in card and "reward_mean_min: reward.mean" in card
    version = client.get_model_version("tiny", "1")
    assert version.tags["forge.gates"] == "fail" and "FAIL by" in version_details("tiny", 1)["gate"]["reward.mean"]
    assert set(client.get_registered_model("tiny").aliases) == {"candidate"}


def test_resume_does_not_redo_a_finished_stages_evaluation(tmp_path, monkeypatch):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage("one", max_steps=3),
                                           pretrain_stage("two", max_steps=4, checkpoint={"every": 2})],
                         eval={"max_blocks": 2, "seq_len": 32, "after_each_stage": True},
                         tracking={"uri": f"sqlite:///{tmp_path}/mlflow.db", "register_model": False})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        crash_after(m, 3 + 3)  # stage one takes 3 batches, stage two crashes on its 4th
        assert cli.main(["run", str(path)]) == 1
    measured = json.loads((out / "eval" / "measured.json").read_text())["models"]
    assert sorted(e["label"] for e in measured.values()) == ["one", "start"]

    import forge.eval.suite as suite

    loaded, real = [], suite.load
    monkeypatch.setattr(suite, "load", lambda path, device: loaded.append(str(path)) or real(path, device))
    logged = _suite_logs(monkeypatch)
    assert cli.main(["run", str(path), "--resume"]) == 0
    assert loaded == [str(out / "stages" / "two" / "final")]  # not the start, not stage one, not the Novella's copy
    client, stages = _runs(tmp_path, out)
    assert [run_id for run_id, _ in logged if run_id] == [stages["two"]]  # stage one's: not logged again
    assert "suite.ppl.general" in client.get_run(stages["one"]).data.params
    ev = json.loads((out / "novella" / "lineage.json").read_text())["evaluation"]
    assert [m["label"] for m in ev["models"]] == ["start", "one", "novella"]
