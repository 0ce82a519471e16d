"""Post-training in a whole recipe: pretrain -> SFT with merge-back, through `forge run`; the merged
model is what flows on and what lineage records, and it loads and generates."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from forge import cli
from forge_testing import base_recipe, pretrain_stage, write_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
from sft_fixtures import write_qa  # noqa: E402


@pytest.mark.slow
def test_pretrain_then_sft_with_merge_back(tmp_path):
    qa = write_qa(tmp_path / "qa.jsonl")
    recipe = base_recipe(tmp_path, stages=[
        pretrain_stage("cpt", max_steps=2),
        {"name": "sft", "kind": "sft", "data": ["qa"], "max_steps": 3, "seq_len": 64, "batch_size": 4,
         "optim": {"lr": 1e-2}, "merge": {"weight": 0.7}, "samples": {"every": 3, "prompts": 2, "max_new_tokens": 4}},
    ], tracking={"register_model": False})
    recipe["data"]["qa"] = {"path": str(qa), "chat": {"kind": "prompt_completion"}, "holdout": 0.1}
    assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0

    out = tmp_path / "out"
    lineage = json.loads((out / "novella" / "lineage.json").read_text())
    cpt, sft = lineage["stages"]
    merged, trained = out / "stages/sft/merged", out / "stages/sft/final"
    assert sft["merge"] == {"weight": 0.7, "trained_checkpoint": str(trained),
                            "input_checkpoint": cpt["output_checkpoint"], "output_checkpoint": str(merged)}
    assert sft["output_checkpoint"] == str(merged) and sft["input_checkpoint"] == str(out / "stages/cpt/final")
    a, b, m = (load_file(str(p / "model.safetensors")) for p in (trained, out / "stages/cpt/final", merged))
    for k in m:
        torch.testing.assert_close(m[k], (0.7 * a[k].double() + 0.3 * b[k].double()).to(m[k].dtype))
    assert torch.equal(load_file(str(out / "novella" / "model.safetensors"))["model.norm.weight"], m["model.norm.weight"])

    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out / "novella")
    model = AutoModelForCausalLM.from_pretrained(out / "novella")
    ids = tok.apply_chat_template([{"role": "user", "content": "What color is the sky?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    assert model.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] > ids["input_ids"].shape[1]
    tables = list((out / "mlartifacts").rglob("samples/step-0000003.json"))
    assert len(tables) == 1 and len(json.loads(tables[0].read_text())["data"]) == 2

    # the SFT stage's run reads like a pretraining one: curves grouped by section, single figures
    # (data-format counts, final results) as summary params, a description naming the merge-back
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    sft_run = client.get_run(json.loads((out / "tracking.json").read_text())["stages"]["sft"])
    assert {"train/loss", "train/lr", "train/epoch", "train/target_tokens"} <= set(sft_run.data.metrics)
    assert all(k.startswith(("train/", "eval/", "system/")) for k in sft_run.data.metrics), sorted(sft_run.data.metrics)
    assert int(sft_run.data.params["data.qa.examples"]) > 0 and "final.loss" in sft_run.data.params
    note = sft_run.data.tags["mlflow.note.content"]
    assert note.startswith("**sft** (sft): 3 steps") and "- merged back: 0.7 of the trained weights" in note
    assert f"- to: `{merged}`" in note
