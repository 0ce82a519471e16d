"""A real pretrained model (stories260K) continued-pretrained on real domain data (MedQuAD)."""
from __future__ import annotations

import pytest

from forge.inputs import resolve_source
from forge.recipe import DataSource, PretrainStage
from forge_testing import run_stage, shared_path


@pytest.mark.slow
def test_domain_perplexity_drops_after_continued_pretraining(tmp_path):
    model = shared_path("models", "stories260K")
    qa = shared_path("domain", "medquad_cancergov", "cancergov_qa.jsonl")
    spec = DataSource(path=str(qa), text_field=["question", "answer"], holdout=0.1)
    sources = {"medquad": resolve_source("medquad", spec, tmp_path)}
    stage = PretrainStage(name="cpt", kind="pretrain", mixture={"medquad": 1.0}, max_steps=60, seq_len=128,
                          batch_size=8, optim={"lr": 2e-3}, schedule={"warmup_steps": 5}, separator="bos",
                          eval={"max_blocks": 16})
    result = run_stage(stage, model, sources, tmp_path / "cpt")
    before, after = result.metrics["eval_loss_start"], result.metrics["eval_loss"]
    # held-out documents never trained on: perplexity exp(loss) must fall clearly
    assert after < before - 0.3, (before, after)
