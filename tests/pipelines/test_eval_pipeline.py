"""The eval: block at the end of `forge run` and `forge eval`: figures in lineage, MLflow and the
model card (without training text); gates withholding the deployment alias; champion promotion
with the old champion demoted; `forge eval --json` schema for a run and for any models."""
from __future__ import annotations

import json

import mlflow
import pytest

from forge import cli
from forge.track import version_details
from forge_testing import base_recipe, pretrain_stage, write_recipe

pytestmark = pytest.mark.slow

EVAL = {"max_blocks": 2, "seq_len": 32, "after_each_stage": True,
        "gates": {"retention_ppl_increase_max": 5.0, "domain_ppl_decrease_min": 0.0}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs of one recipe into one registry: passes (champion), fails a gate (--strict), better."""
    tmp = tmp_path_factory.mktemp("evalrun")
    recipe = base_recipe(tmp, stages=[
        pretrain_stage("general", max_steps=2, eval={"max_blocks": 2}),
        pretrain_stage("domain", mixture={"domain": 0.7, "general": 0.3}, max_steps=2, eval={"max_blocks": 2}),
    ], eval=EVAL, tracking={"uri": f"sqlite:///{tmp}/mlflow.db"})
    path = write_recipe(tmp / "r.yaml", recipe)
    codes = [cli.main(["run", str(path), f"output={tmp}/one"]),
             cli.main(["run", str(path), f"output={tmp}/two", "eval.gates.domain_ppl_decrease_min=0.99", "--strict"]),
             cli.main(["run", str(path), f"output={tmp}/three", "stages[1].max_steps=10", "stages[1].optim.lr=0.01"])]
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    return tmp, path, codes, mlflow.MlflowClient()


def test_lineage_card_and_mlflow_hold_the_evaluation(runs):
    tmp, _, codes, client = runs
    assert codes[0] == 0
    novella = tmp / "one" / "novella"
    ev = json.loads((novella / "lineage.json").read_text())["evaluation"]
    assert [m["label"] for m in ev["models"]] == ["start", "general", "novella"]
    final = ev["models"][-1]["metrics"]
    assert {"ppl.domain", "ppl.general", "retention.general", "domain_gain.domain"} <= set(final)
    assert ev["passed"] and ev["version"] == 1
    card = (novella / "MODEL_CARD.md").read_text()
    assert "## Evaluation" in card and "| ppl.domain |" in card and "took `champion`" in card
    # no training text in the card: no sentence of either source appears in it
    for source in ("general", "domain"):
        for line in (tmp / "one" / "data").rglob(f"{source}*.jsonl"):
            for row in line.read_text().splitlines()[:300]:
                for sentence in json.loads(row)["text"].split(". "):
                    assert len(sentence) < 25 or sentence not in card
    exp = client.get_experiment_by_name("tiny")
    parent = [r for r in client.search_runs([exp.experiment_id], "attributes.run_name = 'tiny'")
              if r.info.run_id == json.loads((tmp / "one" / "tracking.json").read_text())["parent"]][0]
    files = {a.path for a in client.list_artifacts(parent.info.run_id, "eval")}
    assert {"eval/comparison.png", "eval/comparison.json", "eval/comparison.md"} <= files
    assert "MODEL_CARD.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    # single figures: params and summary.json rows (4 significant digits), not one-point charts
    assert float(parent.data.params["suite.ppl.domain"].replace(",", "")) == pytest.approx(final["ppl.domain"], rel=1e-3)
    assert not [k for k in parent.data.metrics if k.startswith("suite")]
    stages = json.loads((tmp / "one" / "tracking.json").read_text())["stages"]
    general = client.get_run(stages["general"]).data.params
    assert float(general["suite.ppl.general"].replace(",", "")) == pytest.approx(ev["models"][1]["metrics"]["ppl.general"],
                                                                               rel=1e-3)
    rows = json.loads(open(client.download_artifacts(stages["general"], "summary.json")).read())["data"]
    assert ["suite", "ppl.general", general["suite.ppl.general"]] in rows
    tags = client.get_model_version("tiny", "1").tags
    assert tags["forge.base"].startswith("scratch llama: hidden 32") and tags["forge.gates"] == "pass"
    compute = version_details("tiny", 1)["compute"]  # compute details: one JSON artifact, not a wall of tags
    assert compute["domain.planned_steps"] == "2" and compute["domain.steps"] == "2"


def test_failing_gate_registers_without_the_alias_and_strict_exits_non_zero(runs):
    tmp, _, codes, client = runs
    assert codes[1] == 1
    v2 = client.get_model_version("tiny", "2")
    assert v2.tags["forge.gates"] == "fail" and v2.tags["forge.champion"] == "no"
    assert "FAIL by" in version_details("tiny", 2)["gate"]["domain_gain.domain"]
    assert (tmp / "two" / "novella" / "MODEL_CARD.md").is_file()


def test_a_better_run_takes_champion_and_the_old_one_is_previous_champion(runs):
    _, _, codes, client = runs
    assert codes[2] == 0
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "3"
    assert str(client.get_model_version_by_alias("tiny", "previous-champion").version) == "1"
    assert str(client.get_model_version_by_alias("tiny", "candidate").version) == "3"


def test_forge_eval_recipe_json(runs, capsys):
    tmp, path, _, _ = runs
    out = tmp / "eval.json"
    assert cli.main(["eval", str(path), f"output={tmp}/one", "--json", str(out), "--chart", str(tmp / "c.png")]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == "forge.eval/1" and data["baseline"] == "start"
    assert [m["label"] for m in data["models"]] == ["start", "general", "novella"]
    assert set(data["deltas"]) == {"general", "novella"} and data["passed"] is True
    assert {"gate", "metric", "value", "limit", "kind", "passed", "text"} <= set(data["gates"][0])
    assert (tmp / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert "retention.general" in capsys.readouterr().out


def test_forge_eval_models_with_a_suite_file(runs, tmp_path, capsys):
    tmp = runs[0]
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"q": f"Where is part {i} built?", "a": "Oslo"}) + "\n" for i in range(3)))
    suite = {"data": {"qa": {"path": str(qa), "text_field": ["q", "a"], "holdout": 0.0},
                      "general": {"generate": {"kind": "stories", "documents": 50}}},
             "eval": {"perplexity": ["general"], "domain": [], "general": [], "seq_len": 32, "max_blocks": 2,
                      "fact_recall": {"source": "qa", "question_field": "q", "answer_field": "a", "max_new_tokens": 4},
                      "gates": {"fact_recall_min": 0.9}}}
    file = write_recipe(tmp_path / "suite.yaml", suite)
    models = f"base={next((tmp / 'one').glob('base-*'))},{tmp}/one/novella"
    out = tmp_path / "e.json"
    assert cli.main(["eval", "--models", models, "--suite", str(file), "--json", str(out)]) == 0
    assert cli.main(["eval", "--models", models, "--suite", str(file), "--strict"]) == 1
    data = json.loads(out.read_text())
    assert [m["label"] for m in data["models"]] == ["base", "novella"]
    assert data["models"][1]["metrics"]["fact_recall.contains"] == 0.0 and not data["passed"]
    assert "ppl.general" in data["models"][0]["metrics"]
    assert "fact_recall_min: fact_recall.contains = 0, at least 0.9: FAIL by 0.9" in capsys.readouterr().out
