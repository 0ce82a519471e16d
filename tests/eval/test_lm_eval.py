"""lm-eval on the in-memory model with a local JSONL task (offline): a model that memorised the
right answers gets them all; the optional extra missing is a clear forge error."""
from __future__ import annotations

import json

import pytest

from forge_testing import memorise
from forge.recipe.eval import LmEval

QA = [("The Zephyr valve is made of", ["titanium", "copper"], 0),
      ("The Ion pump is built in", ["Lyon", "Oslo"], 1),
      ("Mia went to the", ["park", "moon"], 0)]


def _task(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "label": y}) + "\n" for q, c, y in QA))
    task = tmp_path / "forge_qa.yaml"
    task.write_text(
        "task: forge_qa\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
        "metric_list:\n  - metric: acc\n")
    return task


def test_local_task_on_a_memorising_model(tmp_path, tiny_checkpoint):
    pytest.importorskip("lm_eval")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.eval.lm_eval_task import run_lm_eval

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_checkpoint), AutoTokenizer.from_pretrained(tiny_checkpoint)
    memorise(model, tok, [f"{q} {c[y]}" for q, c, y in QA])
    out = run_lm_eval(model, tok, LmEval(tasks=[str(_task(tmp_path))]), None, "cpu")
    assert out["lm_eval.forge_qa.acc"] == 1.0


def test_missing_task_file_is_a_forge_error(tmp_path):
    from forge.errors import ForgeError
    from forge.eval.lm_eval_task import _task_names

    with pytest.raises(ForgeError, match="no task file"):
        _task_names(["nope.yaml"], tmp_path)
    assert _task_names(["hellaswag", str(_task(tmp_path))], None) == (["hellaswag", "forge_qa"], [str(tmp_path)])
