"""How figures reach MLflow: every stage kind's curves get a sectioned name, single figures go into a
run's summary (also a finished run's, by id), and a registered version's description fits MLflow."""
from __future__ import annotations

import json

import pytest

from forge.lineage import Lineage
from forge.track.notes import model_description
from forge.track import MlflowTracker, metric_name


@pytest.mark.parametrize("key, name", [
    ("loss", "train/loss"), ("tokens.web", "train/tokens/web"), ("eval_loss", "eval/loss"),
    ("eval.web.ppl", "eval/web/ppl"),                                   # pretrain, midtrain
    ("epoch", "train/epoch"), ("target_tokens", "train/target_tokens"),  # sft
    ("rewards/margin", "train/rewards/margin"), ("eval_rewards/accuracy", "eval/rewards/accuracy"),  # dpo
    ("reward_mean", "train/reward_mean"), ("reward.exact_match.mean", "train/reward/exact_match/mean"),
    ("kl", "train/kl"), ("clip_fraction", "train/clip_fraction"),       # rft
    ("system/cpu_utilization_percentage", "system/cpu_utilization_percentage"),
])
def test_every_stage_kinds_curves_have_a_section(key, name):
    assert metric_name(key) == name


def test_summary_into_a_finished_run_by_id(tmp_path):
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "x")
    with tracker.run("parent"):
        with tracker.run("stage") as stage:
            pass
        tracker.log_summary("suite", {"ppl.web": 12.3456, "retention.web": 0.01}, run_id=stage)
    client = tracker._mlflow.MlflowClient()
    run = client.get_run(stage)
    assert run.data.params["suite.ppl.web"] == "12.35" and not run.data.metrics
    rows = json.loads(open(client.download_artifacts(stage, "summary.json")).read())["data"]
    assert ["suite", "retention.web", "0.01"] in rows


def test_version_description_is_the_lineage_then_the_card_cut_to_fit():
    lineage = {"name": "acme", "base": {"spec": "/models/base"}, "stages": [{"name": "sft", "kind": "sft"}],
               "data": {"qa": {"sha256": "ab" * 32, "tokens": 1200}}, "metrics": {"loss": 0.5}}
    card = "# acme\n\n## Evaluation\n\n" + "| ppl.qa | 12 |\n" * 600
    lineage = Lineage.model_validate(lineage)
    text = model_description(lineage, "run1", card)
    assert text.startswith("Novella **acme**: /models/base customized by sft (sft).")
    assert "\n## Evaluation" in text and "# acme" not in text
    assert len(text) <= 5000 and text.endswith("MODEL_CARD.md among the source run's artifacts)")
    assert model_description(lineage, "run1") == text.split("\n\n## Evaluation")[0]
