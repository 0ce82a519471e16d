"""How forge's runs open in MLflow's UI, checked in the store: the experiment's kind, the shared view
a pipeline's parent run leaves (sort, headline columns), the parent's headline metrics and HTML
comparison, the registered version's handful of tags (details in one JSON), and the trained vocab
in the base's description."""
from __future__ import annotations

import json

import mlflow
import pytest

from forge.lineage import EvaluationRecord
from forge.recipe.eval import higher_is_better
from forge.track import MlflowTracker, version_details
from forge.track.notes import base_summary
from forge.track.registry import SHOWN_TAGS, split_tags
from forge.track.story import COMPARISON_HTML, comparison_html, log_story
from forge.track.view import (
    EXPERIMENT_KIND_TAG,
    MAX_COLUMNS,
    MODEL_DEVELOPMENT,
    VIEW_TAG,
    experiment_url,
    headline_columns,
    run_url,
    story_metrics,
    view_state,
)

EVALUATION = {
    "models": [{"label": "start", "path": "/b", "metrics": {"loss.domain": 5.95, "ppl.domain": 384.19,
                                                            "retention.general": 0.0, "fact_recall.exact": 0.1}},
               {"label": "novella", "path": "/n", "metrics": {"loss.domain": 4.99, "ppl.domain": 147.99,
                                                              "retention.general": 0.047, "fact_recall.exact": 0.35}}],
    "gates": [{"gate": "retention_ppl_increase_max", "metric": "retention.general", "value": 0.047, "limit": 0.1,
               "kind": "max", "passed": True, "text": "retention.general = 0.047, at most 0.1: pass"},
              {"gate": "fact_recall_min", "metric": "fact_recall.exact", "value": 0.35, "limit": 0.5,
               "kind": "min", "passed": False, "text": "fact_recall.exact = 0.35, at least 0.5: FAIL by 0.15"}],
    "passed": False,
}


def test_headline_columns_pair_baseline_and_novella():
    parent = story_metrics(EVALUATION)
    assert parent["novella/ppl.domain"] == 147.99 and parent["start/retention.general"] == 0.0
    columns = headline_columns(parent, {"eval/loss", "train/loss", "train/reward_mean"})
    # stage headlines first; loss.* left out beside ppl.*; a baseline change against itself (0) left out
    assert columns == ["eval/loss", "train/reward_mean", "start/ppl.domain", "novella/ppl.domain",
                       "novella/retention.general", "start/fact_recall.exact", "novella/fact_recall.exact"]


def test_view_state_sorts_flat_and_selects_the_columns():
    state = json.loads(view_state(["eval/loss", "novella/ppl.domain"]))
    assert state["orderByKey"] == "attributes.`Created`" and state["orderByAsc"] is True  # not start_time: no nesting
    assert state["selectedColumns"] == ["metrics.`eval/loss`", "metrics.`novella/ppl.domain`", "attributes.`Models`"]
    assert state["columnOrder"] == state["selectedColumns"] and "runsExpanded" not in state
    many = json.loads(view_state([f"novella/{'x' * 240}.{i}" for i in range(200)]))
    assert 1 < len(many["selectedColumns"]) <= MAX_COLUMNS + 1  # capped, and under MLflow's 20,000 characters
    assert len(view_state([f"novella/{'x' * 240}.{i}" for i in range(200)])) <= 20_000


def test_links_open_the_model_training_layout():
    assert experiment_url("http://h:5050", "3", view=True) == \
        "http://h:5050/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=forge"
    assert run_url("http://h", "3", "abc") == "http://h/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert experiment_url("http://h") == "http://h/#/experiments?workflowType=machine_learning"


def test_comparison_html_is_a_readable_table():
    page = comparison_html(EvaluationRecord.model_validate(EVALUATION), higher_is_better)
    assert "<caption>start versus novella (deltas against start)</caption>" in page
    assert "<tr><td>ppl.domain</td><td>384.19</td><td>147.99</td><td class=\"better\">-236.2 (-61.5%) better</td></tr>" in page
    assert "<td class=\"worse\">+0.047 worse</td>" in page  # retention: more forgetting is worse, no relative %
    assert "Gates: <span class=\"fail\">FAIL</span>" in page and "FAIL by 0.15</li>" in page
    bad = {**EVALUATION, "models": [{"label": "<b>", "path": "", "metrics": {"ppl.<i>": 1.0}}]}
    assert "&lt;b&gt;" in comparison_html(EvaluationRecord.model_validate(bad), higher_is_better)


def _tracker(tmp_path, name="exp"):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", name)
    return tracker, mlflow.MlflowClient()


@pytest.mark.slow
def test_experiment_is_created_as_model_development(tmp_path):
    _, client = _tracker(tmp_path)
    assert client.get_experiment_by_name("exp").tags[EXPERIMENT_KIND_TAG] == MODEL_DEVELOPMENT
    other = client.create_experiment("theirs", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    client.create_experiment("untagged")
    _tracker(tmp_path, "theirs")
    _tracker(tmp_path, "untagged")
    assert client.get_experiment(other).tags[EXPERIMENT_KIND_TAG] == "genai_development"  # someone's choice stays
    assert client.get_experiment_by_name("untagged").tags[EXPERIMENT_KIND_TAG] == MODEL_DEVELOPMENT


@pytest.mark.slow
def test_parent_run_carries_metrics_html_and_leaves_the_view(tmp_path):
    tracker, client = _tracker(tmp_path)
    with tracker.run("lonely"):  # no child runs: not a pipeline, no view
        pass
    assert VIEW_TAG not in client.get_experiment_by_name("exp").tags
    with tracker.run("pipeline") as parent:
        with tracker.run("stage"):
            tracker.log_metrics({"eval_loss": 2.5, "loss": 2.7}, step=1)
        log_story(tracker, EvaluationRecord.model_validate(EVALUATION), higher_is_better)
    run = client.get_run(parent)
    assert run.data.metrics["novella/ppl.domain"] == 147.99 and run.data.metrics["start/ppl.domain"] == 384.19
    assert len([k for k in run.data.metrics if k.startswith(("start/", "novella/"))]) == 8
    page = open(client.download_artifacts(parent, COMPARISON_HTML, str(tmp_path))).read()
    assert "<td>ppl.domain</td>" in page and "FAIL by 0.15" in page
    state = json.loads(client.get_experiment_by_name("exp").tags[VIEW_TAG])
    assert state["selectedColumns"][:3] == ["metrics.`eval/loss`", "metrics.`start/ppl.domain`",
                                            "metrics.`novella/ppl.domain`"]


def test_log_story_without_an_evaluation_logs_nothing(tmp_path):
    tracker, client = _tracker(tmp_path)
    with tracker.run("p") as parent:
        log_story(tracker, None, higher_is_better)
    assert client.get_run(parent).data.metrics == {} and client.list_artifacts(parent) == []


def test_split_tags_keeps_a_handful():
    tags = {"forge.base": "scratch", "forge.stages": "a,b", "forge.gates": "pass", "forge.run_id": "r1",
            "forge.primary_metric": "ppl.d", "forge.primary_value": "1.5", "forge.data.domain": "abc",
            "forge.gate.retention.general": "retention.general = 0.01: pass",
            "forge.compute.a.steps": "8", "forge.compute.a.train_hours": "0.001", "forge.plan": "a: local"}
    shown, details = split_tags(tags)
    assert set(shown) == set(SHOWN_TAGS)
    assert details == {"run_id": "r1", "data": {"domain": "abc"}, "plan": "a: local",
                       "gate": {"retention.general": "retention.general = 0.01: pass"},
                       "compute": {"a.steps": "8", "a.train_hours": "0.001"}}


@pytest.mark.slow
def test_registered_version_has_few_tags_and_a_details_artifact(tmp_path, tiny_checkpoint):
    tracker, client = _tracker(tmp_path)
    tags = {"forge.base": "scratch", "forge.stages": "a", "forge.gates": "pass", "forge.primary_metric": "ppl.d",
            "forge.primary_value": "1.5", **{f"forge.compute.a.k{i}": str(i) for i in range(12)}}
    with tracker.run("p") as parent:
        version = tracker.register_model(tiny_checkpoint, "tiny", "candidate", tags)
    mv = client.get_model_version("tiny", str(version))
    assert len(mv.tags) == 5 and not any(k.startswith("forge.compute") for k in mv.tags)
    details = version_details("tiny", version)
    assert details["compute"]["a.k11"] == "11" and details["version"] == version
    assert mv.run_id == parent


def test_base_summary_says_the_trained_vocab(tmp_path):
    spec = {"scratch": {"arch": "llama", "hidden_size": 32, "layers": 2, "heads": 4, "vocab_size": 1024}}
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 698}))
    assert base_summary(spec, tmp_path) == "scratch llama: hidden 32, 2 layers, 4 heads, vocab 698 (1024 asked)"
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1024}))
    assert base_summary(spec, tmp_path).endswith("vocab 1024")
    assert base_summary(spec, tmp_path / "gone").endswith("vocab 1024")  # not built: the recipe's figure


def test_a_tracking_servers_run_link_opens_the_training_layout(tmp_path, capsys):
    import os

    from forge.track.experiment import after_run

    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"  # MLflow's own links open GenAI
    tracker, client = _tracker(tmp_path)
    with tracker.run("p") as parent:
        pass
    after_run(mlflow, parent, "http://mlflow.internal:5050/")
    exp = client.get_experiment_by_name("exp").experiment_id
    assert capsys.readouterr().out.strip() == (f"forge: MLflow run page: http://mlflow.internal:5050/#/experiments/"
                                               f"{exp}/runs/{parent}?workflowType=machine_learning")
