"""Every evaluation of a pretrain stage reports loss and perplexity per source, and the mixed
figure is their token-weighted mean."""
from __future__ import annotations

import math

from forge.recipe import PretrainStage
from forge_testing import Recorder, pretrain_stage, run_stage


def test_per_source_losses_average_back_to_the_mixed_loss(tmp_path, tiny_checkpoint, generated_sources):
    stage = PretrainStage(**pretrain_stage(mixture={"general": 0.5, "domain": 0.5}, max_steps=4,
                                           eval={"every": 2, "max_blocks": 4}))
    tracker = Recorder()
    result = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path, tracker)
    evals = [(s, m) for s, m in tracker.rows if "eval_loss" in m]
    assert [s for s, _ in evals] == [0, 2, 4]
    from transformers import AutoTokenizer

    from forge.data.mixing import eval_blocks

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    blocks = {n: eval_blocks(generated_sources, {n: 1.0}, tok, 32, "eos", 4) for n in ("general", "domain")}
    tokens = {n: b.shape[0] * (b.shape[1] - 1) for n, b in blocks.items()}
    for _, m in evals:
        for n in ("general", "domain"):
            assert math.isclose(m[f"eval.{n}.ppl"], math.exp(m[f"eval.{n}.loss"]), rel_tol=1e-9)
        weighted = sum(m[f"eval.{n}.loss"] * tokens[n] for n in tokens) / sum(tokens.values())
        assert math.isclose(m["eval_loss"], weighted, rel_tol=1e-9)
        assert m["eval.general.loss"] != m["eval.domain.loss"]
    assert result.metrics["eval.domain.loss"] == evals[-1][1]["eval.domain.loss"]
    assert result.metrics["eval.domain.loss_start"] == evals[0][1]["eval.domain.loss"]
