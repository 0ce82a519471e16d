"""Whole recipes on tiny models: chaining, lineage, MLflow runs/metrics/registry, failure handling."""
from __future__ import annotations

import json

import mlflow
import pytest

from forge import cli
from forge.recipe import load_recipe
from forge.track import version_details
from forge_testing import base_recipe, pretrain_stage, write_recipe


def _client(recipe):
    mlflow.set_tracking_uri(recipe.tracking_uri)
    return mlflow.MlflowClient()


def _runs(recipe):
    client = _client(recipe)
    exp = client.get_experiment_by_name(recipe.experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


@pytest.fixture(scope="module")
def two_stage(tmp_path_factory):
    """A two-stage recipe run once through the CLI: general pretraining, then a 70/30 domain mix."""
    tmp = tmp_path_factory.mktemp("novella")
    recipe = base_recipe(tmp, stages=[
        pretrain_stage("general", max_steps=6, eval={"every": 3, "max_blocks": 4}),
        pretrain_stage("domain", mixture={"domain": 0.7, "general": 0.3}, max_steps=6, precision="bf16"),
    ], tracking={"alias": "champion"})
    path = write_recipe(tmp / "two.yaml", recipe)
    assert cli.main(["run", str(path)]) == 0
    return load_recipe(path)


@pytest.mark.slow
def test_stages_chain_and_novella_has_lineage(two_stage):
    out = two_stage.output
    lineage = json.loads(open(f"{out}/novella/lineage.json").read())
    first, second = lineage["stages"]
    assert second["input_checkpoint"] == first["output_checkpoint"] == f"{out}/stages/general/final"
    assert first["input_checkpoint"] == lineage["base"]["checkpoint"]
    assert lineage["base"]["checkpoint"].startswith(f"{out}/base-")
    assert second["settings"]["mixture"] == {"domain": 0.7, "general": 0.3}
    assert len(lineage["data"]["domain"]["sha256"]) == 64
    assert lineage["data"]["general"]["tokens"] == 6 * 128 + second["tokens_by_source"]["general"]
    assert lineage["metrics"]["eval_loss"] == second["metrics"]["eval_loss"]
    names = {p.name for p in (__import__("pathlib").Path(out) / "novella").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "lineage.json"} <= names
    assert "max_steps: 6" in open(f"{out}/recipe.resolved.yaml").read()


@pytest.mark.slow
def test_mlflow_holds_parent_children_metrics_and_datasets(two_stage):
    client, parents, children = _runs(two_stage)
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    by_name = {c.info.run_name: c for c in children}
    general, domain = by_name["general"], by_name["domain"]
    assert general.data.params["optim.lr"] == "0.003" and domain.data.params["precision"] == "bf16"
    assert len(client.get_metric_history(general.info.run_id, "train/loss")) == 6
    assert [m.step for m in client.get_metric_history(general.info.run_id, "eval/loss")] == [0, 3, 6]
    assert client.get_metric_history(domain.info.run_id, "train/tokens/domain")[-1].value > 0
    assert {d.dataset.name for d in domain.inputs.dataset_inputs} == {"domain", "general"}
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"lineage.json", "recipe.resolved.yaml"} <= artifacts


@pytest.mark.slow
def test_stage_runs_carry_plan_and_predicted_vs_measured(two_stage):
    client, _, children = _runs(two_stage)
    for child in children:
        assert child.data.params["plan.target"] == "local" and child.data.params["plan.chips"] == "1"
        params = child.data.params  # single figures: params and the summary table, not one-point metrics
        assert float(params["plan.hours"]) > 0 and "plan.cost_usd" in params
        assert float(params["plan.measured.step_time_s"]) > 0 and float(params["plan.predicted.step_time_s"]) > 0
        assert not any(k.startswith(("plan.", "final.")) for k in child.data.metrics)
        assert 50 < float(params["final.peak_rss_mb"].replace(",", "")) < 100_000  # the peak while it trained
        files = {a.path for a in client.list_artifacts(child.info.run_id, "plan")}
        assert {"plan/plan.json", "plan/plan.txt", "plan/plan_targets.png"} <= files


def test_plan_that_cannot_fit_is_refused_before_any_work(tmp_path, capsys):
    huge = {"scratch": {"hidden_size": 8192, "layers": 80, "heads": 64, "vocab_size": 128000,
                        "max_position": 128, "tokenizer_sources": ["general"]}}
    path = write_recipe(tmp_path / "huge.yaml", base_recipe(tmp_path, base=huge))
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "stage 'cpt' on local" in err and "--force" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_registered_model_with_alias_generates(two_stage):
    client = _client(two_stage)
    version = client.get_model_version_by_alias("tiny", "champion")
    assert version.tags["forge.stages"] == "general,domain"
    generate = mlflow.transformers.load_model("models:/tiny@champion")
    text = generate("Once upon a time", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text.startswith("Once upon a time") and len(text) > len("Once upon a time")


@pytest.mark.slow
def test_failing_stage_marks_child_and_parent_failed(tmp_path, monkeypatch, capsys):
    import forge.stages.pretrain as pretrain

    def explode(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(pretrain, "run", explode)
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    assert cli.main(["run", str(path)]) == 1
    assert "disk on fire" in capsys.readouterr().err
    _, parents, children = _runs(load_recipe(path))
    for run in parents + children:
        assert run.info.status == "FAILED"
        assert "disk on fire" in run.data.tags["error"]
    assert not (tmp_path / "out" / "novella").exists()


def test_validate_and_help(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "validate" in out and "run" in out
    good = write_recipe(tmp_path / "good.yaml", base_recipe(tmp_path))
    assert cli.main(["validate", str(good)]) == 0
    bad = write_recipe(tmp_path / "bad.yaml", base_recipe(tmp_path, stages=[pretrain_stage(batch_size=-1)]))
    assert cli.main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "stages[0].batch_size" in err and "Traceback" not in err


@pytest.mark.slow
def test_proprietary_data_is_cleaned_and_secrets_never_logged(tmp_path):
    secret, key = "maria.lopez@example.org", "AKIAIOSFODNN7EXAMPLQ"
    rows = [f"Ticket {i}: the Helix-{i % 7} rotor makes noise at speed {i * 10}; reply to {secret}." for i in range(60)]
    rows += [f"Deploy note {i}: use access key {key} for the staging bucket number {i}." for i in range(20)]
    crm = tmp_path / "crm.jsonl"
    crm.write_text("".join(json.dumps({"body": r}) + "\n" for r in rows))
    recipe = base_recipe(
        tmp_path,
        data={"general": {"generate": {"kind": "stories", "documents": 300}},
              "crm": {"path": str(crm), "text_field": "body", "proprietary": True}},
        stages=[pretrain_stage(mixture={"customer": {"crm": 40}, "curated": {"general": 60}}, max_steps=4)],
        tracking={"register_model": False})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["run", str(path)]) == 0
    loaded = load_recipe(path)
    _, parents, children = _runs(loaded)
    params = parents[0].data.params
    assert params["data.hygiene.pii.email"] == "60" and params["data.hygiene.pii.aws_access_key"] == "20"
    assert 50 < float(params["data.peak_rss_mb"].replace(",", "")) < 100_000  # reading, hygiene and caching the data
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    assert lineage["hygiene"]["hygiene.pii.email"] == 60 and "cleaned" in lineage["data"]["crm"]
    shares = lineage["stages"][0]["shares"]
    assert abs(shares["crm"] - 0.4) <= 0.02
    everything = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert secret.encode() not in everything and key.encode() not in everything


@pytest.mark.slow
def test_run_page_groups_curves_and_has_no_one_point_charts(two_stage):
    client, parents, children = _runs(two_stage)
    for run in parents + children:  # the parent's: its headline figures, start/ and novella/ (forge.track.story)
        for key in run.data.metrics:
            if not key.startswith(("train/", "eval/", "system/", "data/", "start/", "novella/")):
                raise AssertionError(f"{run.info.run_name}: metric {key!r} outside the chart sections")
    for child in children:
        one_point = [k for k in child.data.metrics if len(client.get_metric_history(child.info.run_id, k)) == 1
                     and not k.startswith("train/")]  # a 1-step window may log train/ once; eval has start + end
        assert one_point == [], one_point
        summary = json.loads(open(client.download_artifacts(child.info.run_id, "summary.json")).read())
        rows = {(r[0], r[1]): r[2] for r in summary["data"]}
        assert ("plan", "hours") in rows and float(rows[("final", "eval_loss")]) > 0
    assert {k.split("/")[0] for k in parents[0].data.metrics} == {"start", "novella"}  # headline figures only
    stages = json.loads(open(client.download_artifacts(parents[0].info.run_id, "stages.json")).read())
    assert [r[0] for r in stages["data"]] == ["general", "domain"]
    assert {"planned_s", "measured_s", "eval_loss"} <= set(stages["columns"])


@pytest.mark.slow
def test_runs_and_registered_model_are_described(two_stage):
    client, parents, children = _runs(two_stage)
    note = parents[0].data.tags["mlflow.note.content"]
    assert note.startswith("**tiny**: 2 stage(s) from `scratch llama") and "| general | pretrain |" in note
    for child in children:
        text = child.data.tags["mlflow.note.content"]
        assert text.startswith(f"**{child.info.run_name}** (pretrain): 6 steps")
        assert "- from: `" in text and "- plan: local, 1 chip(s)" in text and "eval loss" in text
    version = client.get_model_version_by_alias("tiny", "champion")
    assert version.tags["forge.base"].startswith("scratch llama: hidden 32, 2 layers") and "{" not in version.tags["forge.base"]
    assert version.run_id == parents[0].info.run_id
    plan = version_details("tiny", version.version)["plan"]  # details: one JSON artifact, not tags
    assert plan.startswith("general: local, 1 chip(s)") and "; domain: local" in plan
    assert version.description.startswith("Novella **tiny**: scratch llama")
    assert "## Evaluation" in version.description  # the model card follows the lineage in brief
    model = client.get_registered_model("tiny").description
    assert model.startswith("Novella **tiny**") and "## Evaluation" not in model


@pytest.mark.slow
def test_system_metrics_per_stage_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # a tiny stage lasts seconds
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=4)],
                         tracking={"register_model": False, "system_metrics": True})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["run", str(path)]) == 0
    _, parents, children = _runs(load_recipe(path))
    assert "system/cpu_utilization_percentage" in children[0].data.metrics
    assert not any(k.startswith("system/") for k in parents[0].data.metrics)  # the stages', not the pipeline's
