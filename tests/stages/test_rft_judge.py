"""RFT rewarded by an LLM judge (a `judge:` reward source): a tiny local judge grades each group of
completions; the stage trains, logs the judge's reward figures and keeps its verdicts in the run folder."""
from __future__ import annotations

import json
import sqlite3

import pytest
from safetensors.torch import load_file

import rft_rewards
from forge.inputs import resolve_source
from forge.recipe import DataSource, RftStage
from forge_testing import run_stage


def test_rft_with_a_local_judge_reward_trains(tmp_path, tiny_checkpoint):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(8)))
    sources = {"p": resolve_source("p", DataSource(path=str(path), holdout=0.0), tmp_path)}
    stage = RftStage(name="rft", kind="rft", data=["p"], max_steps=3, seq_len=64, batch_size=2, group=4,
                     max_new_tokens=8, optim={"lr": 2e-3}, log_every=1,
                     rewards=[{"source": f"judge:{tiny_checkpoint}", "judge": {"scoring": "group"}}])
    t = rft_rewards.RewardRows()
    result = run_stage(stage, tiny_checkpoint, sources, tmp_path / "o", tracker=t)
    assert len(t.rows) == 3
    for row in t.rows:
        assert 1.0 <= row["reward.judge_instruction_following.mean"] <= 5.0
        assert row["reward.judge_instruction_following.mean"] == pytest.approx(row["reward_mean"], rel=1e-6)
    assert any(row["reward.judge_instruction_following.std"] > 0 for row in t.rows)  # graded, not constant
    before, after = load_file(tiny_checkpoint / "model.safetensors"), load_file(result.checkpoint / "model.safetensors")
    assert any(not before[k].equal(after[k]) for k in before)
    db = sqlite3.connect(tmp_path / "o" / "judge" / "judge_cache.sqlite")
    assert db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] >= 3 * 2  # one verdict per group of 4
