"""lm-eval offline, in lm-eval's own task formats (a local JSONL data set behind a task YAML, as a
customer points forge at MMLU, IFEval, BBH or GPQA): a multiple-choice task scored by
log-likelihood and a generation task scored by exact match. A model that memorised the answers
gets them all; `forge run` and `forge eval` carry the figures into MLflow; lm-eval's data-set
cache stays in FORGE_HOME (never ~/.cache)."""
from __future__ import annotations

import json

import pytest

from forge import cli
from forge.recipe.eval import LmEval
from forge_testing import base_recipe, memorise, pretrain_stage, write_recipe

QA = [("The Zephyr valve is made of", ["titanium", "copper"], 0),
      ("The Ion pump is built in", ["Lyon", "Oslo"], 1),
      ("Mia went to the", ["park", "moon"], 0)]


def _mc_task(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "label": y}) + "\n" for q, c, y in QA))
    task = tmp_path / "forge_mc.yaml"
    task.write_text(
        "task: forge_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
        "metric_list:\n  - metric: acc\n")
    return task


def _gen_task(tmp_path):
    """generate_until with greedy decoding, cut at the first full stop; exact match after the
    leading space is removed (lm-eval's remove_whitespace filter)."""
    data = tmp_path / "gen.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": c[y]}) + "\n" for q, c, y in QA))
    task = tmp_path / "forge_gen.yaml"
    task.write_text(
        "task: forge_gen\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: generate_until\n"
        "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['.']\n  max_gen_toks: 8\n  do_sample: false\n"
        "filter_list:\n  - name: strip\n    filter:\n      - function: remove_whitespace\n      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    return task


@pytest.fixture
def forge_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    return tmp_path / "forge-home"


@pytest.mark.slow
def test_both_task_kinds_on_a_memorising_model_cached_in_forge_home(tmp_path, tiny_checkpoint, forge_home):
    import datasets.config
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.eval.lm_eval_task import run_lm_eval

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_checkpoint), AutoTokenizer.from_pretrained(tiny_checkpoint)
    memorise(model, tok, [f"{q} {c[y]}." for q, c, y in QA])
    before = datasets.config.HF_DATASETS_CACHE
    out = run_lm_eval(model, tok, LmEval(tasks=[str(_mc_task(tmp_path)), str(_gen_task(tmp_path))]), None, "cpu")
    assert out["lm_eval.forge_mc.acc"] == 1.0
    assert out["lm_eval.forge_gen.exact_match"] == 1.0
    assert any((forge_home / "datasets").rglob("*.arrow"))  # the local JSONL's cache, in forge's home
    assert datasets.config.HF_DATASETS_CACHE == before


@pytest.mark.slow
def test_a_wrong_answer_is_scored_wrong(tmp_path, tiny_checkpoint, forge_home):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.eval.lm_eval_task import run_lm_eval

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_checkpoint), AutoTokenizer.from_pretrained(tiny_checkpoint)
    memorise(model, tok, [f"{q} {c[1 - y]}." for q, c, y in QA])  # the other choice each time
    out = run_lm_eval(model, tok, LmEval(tasks=[str(_mc_task(tmp_path)), str(_gen_task(tmp_path))]), None, "cpu")
    assert out["lm_eval.forge_mc.acc"] == 0.0 and out["lm_eval.forge_gen.exact_match"] == 0.0


@pytest.mark.slow
def test_forge_run_and_forge_eval_carry_the_figures_into_mlflow(tmp_path, forge_home, capsys):
    import mlflow

    tasks = [str(_mc_task(tmp_path)), str(_gen_task(tmp_path))]
    path = write_recipe(tmp_path / "r.yaml", base_recipe(
        tmp_path, stages=[pretrain_stage(max_steps=2)],
        eval={"max_blocks": 2, "lm_eval": {"tasks": tasks}}))
    assert cli.main(["run", str(path)]) == 0
    out = tmp_path / "out"
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    parent = mlflow.search_runs(experiment_names=["tiny"], filter_string="tags.`forge.pipeline` = 'novella'",
                                output_format="list")[0]
    for name in ("lm_eval.forge_mc.acc", "lm_eval.forge_gen.exact_match"):
        assert 0.0 <= float(parent.data.params[f"suite.{name}"]) <= 1.0, name

    report = tmp_path / "eval.json"
    assert cli.main(["eval", str(path), "--json", str(report)]) == 0
    figures = {m["label"]: m["metrics"] for m in json.loads(report.read_text())["models"]}
    assert {"lm_eval.forge_mc.acc", "lm_eval.forge_gen.exact_match"} <= set(figures["novella"])
    run = mlflow.search_runs(experiment_names=["tiny"], filter_string="tags.`forge.pipeline` = 'eval'",
                             output_format="list")[0]
    assert run.data.tags["forge.eval_of"] == parent.info.run_id
    logged = {**run.data.params, **{k: str(v) for k, v in run.data.metrics.items()}}
    for name in ("lm_eval.forge_mc.acc", "lm_eval.forge_gen.exact_match"):
        assert float(logged[f"suite.{name}"]) == pytest.approx(figures["novella"][name], abs=1e-3), name


def test_missing_task_file_is_a_forge_error(tmp_path):
    from forge.errors import ForgeError
    from forge.eval.lm_eval_task import _task_names

    with pytest.raises(ForgeError, match="no task file"):
        _task_names(["nope.yaml"], tmp_path)
    assert _task_names(["hellaswag", str(_mc_task(tmp_path))], None) == (["hellaswag", "forge_mc"], [str(tmp_path)])
