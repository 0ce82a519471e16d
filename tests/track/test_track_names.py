"""How figures reach MLflow: every stage kind's curves get a sectioned name, single figures go into a
run's summary (also a finished run's, by id), and a registered version's description fits MLflow."""
from __future__ import annotations

import json

import pytest

from forge.lineage import Lineage
from forge.track import MlflowTracker, metric_name
from forge.track.notes import model_description


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


@pytest.mark.slow
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


def test_names_mlflow_refuses_are_made_valid_in_one_place_stable_and_distinct():
    from mlflow.utils.validation import path_not_unique, validate_param_and_metric_name

    from forge.track.names import MAX_NAME, mlflow_key

    long_a, long_b = "reward.grader.metric." + "a" * 300, "reward.grader.metric." + "a" * 299 + "b"
    short_a = mlflow_key(long_a)
    assert len(short_a) == MAX_NAME == 250 and short_a.startswith("reward.grader.metric.aaa")
    assert mlflow_key(long_a) == short_a and mlflow_key(long_b) != short_a  # stable; a shared prefix is not a clash
    for good in ("train/loss", "eval/web/ppl", "stages.0.name", "a b:c-d_e", "x" * 250):
        assert mlflow_key(good) == good  # names MLflow takes are kept as they are
    for bad in ("acc@1", "a\nb", "/abs", "a//b", "a/../b", "a/", ".", "..a", "", "ü€" * 200):
        fixed = mlflow_key(bad)  # what MLflow's own checks accept
        assert validate_param_and_metric_name(fixed) and not path_not_unique(fixed) and len(fixed) <= 250, (bad, fixed)
    assert mlflow_key("acc@1") != mlflow_key("acc#1")  # two names that differ only in a refused character


@pytest.mark.slow
def test_a_long_metric_name_reaches_mlflow_shortened_and_the_other_metrics_with_it(tmp_path):
    """A Nova reward's 300-character metric name used to fail the whole batch: no metric of the
    stage reached MLflow. Now it is shortened, the full name kept in the run's names.json."""
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "x")
    long = "reward.grader.metric." + "m" * 300
    with tracker.run("stage") as run_id:
        tracker.log_metrics({"loss": 1.0, long: 2.0}, step=1)
        tracker.log_params({"reward": {"n" * 260: 1, "n" * 259 + "x": 2}})  # the same first 250 characters
        tracker.set_tags({"t" * 300: "v"})
    client = tracker._mlflow.MlflowClient()
    run = client.get_run(run_id)
    assert run.data.metrics["train/loss"] == 1.0 and len(run.data.metrics) == 2
    [short] = [k for k in run.data.metrics if k != "train/loss"]
    assert run.data.metrics[short] == 2.0 and len(short) <= 250 and short.startswith("reward.grader.metric.mmm")
    assert {v for k, v in run.data.params.items() if k.startswith("reward.nnn")} == {"1", "2"}
    [tag] = [k for k in run.data.tags if k.startswith("ttt")]
    assert run.data.tags[tag] == "v" and len(tag) <= 250
    names = json.loads(open(client.download_artifacts(run_id, "names.json")).read())
    assert names[short] == long and names[tag] == "t" * 300
    assert sorted(v for v in names.values() if v.startswith("reward.nnn")) == ["reward." + "n" * 260,
                                                                              "reward." + "n" * 259 + "x"]


@pytest.mark.slow
def test_a_resumed_run_keeps_the_full_names_an_earlier_process_saved(tmp_path):
    """A resumed stage reopens its run in a new process (a new tracker): names.json gains the new
    process's names and keeps those only the earlier one logged."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first, second = "a." + "m" * 300, "b." + "n" * 300
    tracker = MlflowTracker(uri, "x")
    with tracker.run("stage") as run_id:
        tracker.log_metrics({first: 1.0}, step=1)
    again = MlflowTracker(uri, "x")  # what a resumed process holds: nothing of the first one's tables
    with again.run("stage", run_id=run_id):
        again.log_metrics({second: 2.0}, step=2)
    client = again._mlflow.MlflowClient()
    names = json.loads(open(client.download_artifacts(run_id, "names.json")).read())
    assert sorted(names.values()) == [first, second]
