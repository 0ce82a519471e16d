"""SFT, DPO and RFT under two CPU processes (torchrun, gloo): each runs to completion, logs once
(rank 0), and SFT and DPO end where one process with the same global batch ends."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from forge_testing import REPO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "stages"))
from sft_fixtures import write_qa  # noqa: E402
from test_dpo import write_pairs  # noqa: E402

WORKER = HERE / "post_training_worker.py"
REWARD = HERE.parent / "stages" / "rft_rewards.py"


def stages(per_rank: int) -> list[dict]:
    """The three stages, `per_rank` examples (pairs, prompts) per process and step."""
    common = {"seq_len": 64, "schedule": {"kind": "constant"}, "log_every": 1, "checkpoint": {"final_optimizer": False}}
    return [
        {"name": "sft", "kind": "sft", "data": ["qa"], "max_steps": 3, "batch_size": per_rank, "packing": "pad",
         "optim": {"lr": 1e-2}, "samples": {"every": 3, "prompts": 2, "max_new_tokens": 4}, **common},
        {"name": "dpo", "kind": "dpo", "data": ["prefs"], "max_steps": 3, "batch_size": per_rank, "beta": 0.5,
         "optim": {"lr": 1e-3}, **common},
        {"name": "rft", "kind": "rft", "data": ["p"], "max_steps": 2, "batch_size": per_rank, "group": 4,
         "max_new_tokens": 6, "kl_beta": 0.01, "rewards": [{"source": f"{REWARD}:e_share"}], "optim": {"lr": 1e-3},
         "samples": {"every": 2, "prompts": 1}, **common},
    ]


def write_data(folder: Path) -> Path:
    folder.mkdir()
    write_qa(folder / "qa.jsonl")
    write_pairs(folder / "prefs.jsonl")
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n"
                                                  for i in range(8)))
    return folder


@pytest.mark.slow
def test_sft_dpo_rft_under_two_processes_match_one(tmp_path, tiny_checkpoint):
    data = write_data(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           str(WORKER), json.dumps(stages(2)), str(tiny_checkpoint), str(data), str(tmp_path / "two")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the same global batch in this process: 4 per step instead of 2 on each of 2 ranks
    from post_training_worker import main
    main(json.dumps(stages(4)), str(tiny_checkpoint), str(data), str(tmp_path / "one"))

    two = {s: json.loads((tmp_path / "two" / s / "logged.json").read_text()) for s in ("sft", "dpo", "rft")}
    one = {s: json.loads((tmp_path / "one" / s / "logged.json").read_text()) for s in ("sft", "dpo", "rft")}
    for name in ("sft", "dpo"):
        a, b = two[name]["result"], one[name]["result"]
        for key in [k for k in ("loss", "eval_loss", "eval_rewards/margin", "eval_rewards/accuracy") if k in b]:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (name, key)
        assert a["tokens"] == b["tokens"], name  # every rank's tokens counted, once
        wa = load_file(str(tmp_path / "two" / name / "final" / "model.safetensors"))
        wb = load_file(str(tmp_path / "one" / name / "final" / "model.safetensors"))
        assert max((wa[k] - wb[k]).abs().max().item() for k in wb) < 1e-4, name
        base = load_file(str(tiny_checkpoint / "model.safetensors"))
        assert any(not torch.equal(wa[k], base[k]) for k in base), name  # it trained
    # DPO's logged batch statistics cover both ranks' pairs: the same as one process's
    rows = lambda r: [m for m in r["metrics"] if "rewards/margin" in m]  # noqa: E731
    for x, y in zip(rows(two["dpo"]), rows(one["dpo"])):
        assert x["rewards/margin"] == pytest.approx(y["rewards/margin"], rel=1e-3, abs=1e-5)
    # RFT: both ranks generated and scored their own prompts; one sample table, from rank 0
    rft = two["rft"]
    assert rft["result"]["tokens"] > 0 and len([m for m in rft["metrics"] if "reward_mean" in m]) == 2
    assert (tmp_path / "two" / "rft" / "final" / "model.safetensors").is_file()
    assert two["rft"]["tables"] == ["samples/step-0000002.json"] and two["sft"]["tables"] == ["samples/step-0000003.json"]
