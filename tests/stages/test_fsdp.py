"""FSDP2 on two gloo processes (torchrun): pretraining, SFT and DPO losses (and DPO's margins) step
by step equal one process with the same global batch, as DDP's do (and DDP's held-out figures,
token counts and weights too; its RFT generates and scores on both ranks and logs once); LoRA SFT,
DPO with a live reference and RFT (sharded generation, a sharded KL reference) run to plain Hugging Face outputs;
a run that crashes mid-stage resumes from its DCP shards bitwise (and, resharded, on one process); two one-process "nodes" (a c10d
rendezvous on 127.0.0.1, hybrid sharding) equal the two-process run."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from forge_testing import REPO, pretrain_stage
from servers import kill_tree, spawn

sys.path.insert(0, str(REPO / "tests" / "stages"))
sys.path.insert(0, str(REPO / "tests" / "train"))
from sft_fixtures import write_qa  # noqa: E402
from test_dpo import write_pairs  # noqa: E402

WORKER = REPO / "tests" / "train" / "dist_stages.py"
REWARD = REPO / "tests" / "stages" / "rft_rewards.py"
TOL = 1e-5
FIGURES: dict[str, float] = {}  # max abs difference per check, printed at the end of the module


def stages(per_rank: int) -> list[dict]:
    """Pretraining, SFT and DPO with `per_rank` blocks (examples, pairs) per process and step."""
    common = {"seq_len": 32, "log_every": 1, "checkpoint": {"final_optimizer": False}}
    return [
        pretrain_stage(max_steps=6, batch_size=per_rank, log_every=1, schedule={"kind": "cosine"},
                       checkpoint={"every": 2}, eval={"max_blocks": 2}),
        {"name": "sft", "kind": "sft", "data": ["qa"], "max_steps": 3, "batch_size": per_rank, "packing": "pad",
         "optim": {"lr": 1e-2}, "schedule": {"kind": "constant"}, "eval": {"max_blocks": 1},
         "samples": {"every": 3, "prompts": 2, "max_new_tokens": 4}, **common, "seq_len": 64},
        {"name": "dpo", "kind": "dpo", "data": ["prefs"], "max_steps": 3, "batch_size": per_rank, "beta": 0.5,
         "optim": {"lr": 1e-3}, "schedule": {"kind": "constant"}, "eval": {"max_blocks": 1}, **common,
         "seq_len": 64},
    ]


def rft(per_rank: int) -> dict:
    """RFT with `per_rank` prompts per process and step, each answered `group` times."""
    return {"name": "rft", "kind": "rft", "data": ["p"], "max_steps": 2, "batch_size": per_rank, "group": 4,
            "max_new_tokens": 6, "kl_beta": 0.01, "rewards": [{"source": f"{REWARD}:e_share"}], "optim": {"lr": 1e-3},
            "samples": {"every": 2, "prompts": 1}, "seq_len": 64, "schedule": {"kind": "constant"}, "log_every": 1,
            "checkpoint": {"final_optimizer": False}}


def sharded_only() -> list[dict]:
    """What only the FSDP launch runs: LoRA SFT (merged), DPO with a live reference, RFT with a KL reference,
    pretraining with bf16 compute, activation checkpointing and CPU offload (gloo has bf16 collectives:
    no GPU needed), pretraining that carries the first stage's gathered AdamW moments over, and SFT
    with distilled replay (a sharded teacher)."""
    common = {"seq_len": 64, "log_every": 1, "schedule": {"kind": "constant"}, "checkpoint": {"final_optimizer": False}}
    return [
        {"name": "lora", "kind": "sft", "data": ["qa"], "max_steps": 2, "batch_size": 2, "packing": "pad",
         "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}, "eval": {"max_blocks": 1}, **common},
        {"name": "live", "kind": "dpo", "data": ["prefs"], "max_steps": 2, "batch_size": 2, "reference": "live",
         "eval": {"max_blocks": 1}, "samples": {"every": 2, "prompts": 1, "max_new_tokens": 3}, **common},
        {"name": "rft", "kind": "rft", "data": ["p"], "max_steps": 2, "batch_size": 1, "group": 2, "max_new_tokens": 4,
         "kl_beta": 0.01, "rewards": [{"source": f"{REWARD}:e_share"}], "samples": {"every": 2, "prompts": 1}, **common},
        pretrain_stage("opts", max_steps=2, batch_size=2, parallelism={
            "strategy": "fsdp", "mixed_precision": "bf16", "activation_checkpointing": True, "cpu_offload": True}),
        pretrain_stage("carry", max_steps=2, batch_size=2, optim={"lr": 1e-3, "carry_over": True}, **{"from": "cpt"}),
        # distilled replay, one block a rank: at some steps one rank holds replay and the other answers,
        # and the sharded teacher's forward (a collective) must still run on both
        {"name": "distil", "kind": "sft", "data": ["qa", "general"], "max_steps": 14, "batch_size": 1,
         "replay_distill": 1.0, **common},
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(config: dict, nodes: int = 1, nproc: int = 2) -> str:
    """The worker on `nproc` processes under one torchrun, or on `nodes`=2 torchruns with one each;
    returns what they printed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    port = free_port()
    if nodes == 1:
        heads = [["--nproc-per-node", str(nproc), "--master-port", str(port)]]
    else:
        heads = [["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "forge-test"] for i in range(2)]
    procs = [spawn([sys.executable, "-m", "torch.distributed.run", *head, str(WORKER), json.dumps(config)], cwd=REPO,
                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for head in heads]
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            kill_tree(p)
    for i, (p, out) in enumerate(zip(procs, outs)):
        Path(config["out"]).mkdir(parents=True, exist_ok=True)
        (Path(config["out"]) / f"launch-{i}.log").write_text(out)
        if p.returncode != 0 and config.get("crash_after") is None:
            first = out.find("Traceback")  # the failing rank's own traceback, before torchrun's summary
            raise AssertionError(out[first:first + 4000])
    return "".join(outs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_checkpoint) -> dict:
    root = tmp_path_factory.mktemp("fsdp")
    data = root / "data"
    data.mkdir()
    write_qa(data / "qa.jsonl")
    write_pairs(data / "prefs.jsonl")
    (data / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n"
                                                for i in range(8)))
    base = {"checkpoint": str(tiny_checkpoint), "data": str(data), "generated": str(tiny_checkpoint.parent)}
    outs = {name: root / name for name in ("one", "ddp", "fsdp")}
    launch({**base, "stages": stages(2) + sharded_only(), "parallelism": {"strategy": "fsdp"}, "out": str(outs["fsdp"])})
    launch({**base, "stages": stages(2) + [rft(2)], "parallelism": "ddp", "out": str(outs["ddp"])})
    from dist_stages import main  # the same global batch in this one process: 4 per step instead of 2 on each of 2
    main(json.dumps({**base, "stages": stages(4), "parallelism": "ddp", "out": str(outs["one"])}))
    return {**outs, "base": base, "root": root}


def logged(out: Path, stage: str) -> dict:
    return json.loads((out / stage / "logged.json").read_text())


def series(out: Path, stage: str, key: str) -> list[float]:
    return [row[key] for row in logged(out, stage)["rows"] if key in row and "loss" in row]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_rank_cuts_only_its_own_blocks_of_a_layout_planned_once(runs, strategy):
    """Issue 23 item 4: rank 0 plans the launch's blocks once; each rank cuts its own half (6 steps x 2
    blocks), where the one process with the same global batch cut all 24."""
    cpt = runs[strategy] / "cpt"
    assert [json.loads((cpt / f"read-rank{r}.json").read_text())["read"] for r in (0, 1)] == [12, 12]
    assert json.loads((runs["one"] / "cpt" / "read-rank0.json").read_text())["read"] == 24
    layouts = sorted(p.name for p in (cpt / "blocks").iterdir())
    assert len(layouts) == 1 and layouts[0].startswith("blocks-") and (cpt / "blocks" / layouts[0] / "meta.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("stage,key", [("cpt", "loss"), ("sft", "loss"), ("dpo", "loss"), ("dpo", "rewards/margin")])
def test_fsdp_and_ddp_on_two_processes_equal_one_process_step_by_step(runs, stage, key):
    one = series(runs["one"], stage, key)
    assert len(one) == {"cpt": 6, "sft": 3, "dpo": 3}[stage]
    for strategy in ("fsdp", "ddp"):
        diff = max_diff(series(runs[strategy], stage, key), one)
        FIGURES[f"{strategy} vs one process, {stage} {key}"] = diff
        assert diff < TOL, (strategy, stage, key, diff)
    ours = weights(runs["fsdp"] / stage / "final")
    theirs = weights(runs["one"] / stage / "final")
    assert ours.keys() == theirs.keys()  # a plain Hugging Face folder, gathered from the shards
    assert max((ours[k] - theirs[k]).abs().max().item() for k in theirs) < 1e-4
    if stage == "cpt":  # the final optimizer state, gathered whole, in optimizer.state_dict()'s own form
        mine, one = (torch.load(r / "cpt" / "final" / "training_state.pt", weights_only=True)["optimizer"]
                     for r in (runs["fsdp"], runs["one"]))
        assert mine["state"].keys() == one["state"].keys()
        diff = max((mine["state"][i][m] - one["state"][i][m]).abs().max().item()
                   for i in one["state"] for m in ("exp_avg", "exp_avg_sq"))
        FIGURES["fsdp vs one process, cpt final AdamW moments"] = diff
        assert diff < TOL


@pytest.mark.slow
def test_ddp_post_training_ends_where_one_process_ends_and_rft_logs_once(runs, tiny_checkpoint):
    """Under DDP, SFT and DPO end with one process's held-out figures, token counts (every rank's,
    counted once) and weights; DPO's logged batch statistics cover both ranks' pairs; RFT generates
    and scores on both ranks and rank 0 alone logs its rows and sample table."""
    base = weights(tiny_checkpoint)
    for name in ("sft", "dpo"):
        two, one = logged(runs["ddp"], name)["result"], logged(runs["one"], name)["result"]
        for key in [k for k in ("loss", "eval_loss", "eval_rewards/margin", "eval_rewards/accuracy") if k in one]:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), (name, key)
        assert two["tokens"] == one["tokens"], name
        ours, theirs = weights(runs["ddp"] / name / "final"), weights(runs["one"] / name / "final")
        assert max((ours[k] - theirs[k]).abs().max().item() for k in theirs) < 1e-4, name
        assert any(not torch.equal(ours[k], base[k]) for k in base), name  # it trained
    margins = [[r["rewards/margin"] for r in logged(runs[w], "dpo")["rows"] if "rewards/margin" in r]
               for w in ("ddp", "one")]
    assert margins[0] and margins[0] == pytest.approx(margins[1], rel=1e-3, abs=1e-5)
    rft_run = logged(runs["ddp"], "rft")
    assert rft_run["result"]["tokens"] > 0 and len([r for r in rft_run["rows"] if "reward_mean" in r]) == 2
    assert (runs["ddp"] / "rft" / "final" / "model.safetensors").is_file()
    assert rft_run["tables"] == ["samples/step-0000002.json"]
    assert logged(runs["ddp"], "sft")["tables"] == ["samples/step-0000003.json"]


@pytest.mark.slow
def test_lora_live_reference_rft_offload_and_carry_over_train_sharded_to_plain_outputs(runs, tiny_checkpoint):
    base = weights(tiny_checkpoint)
    for stage in ("lora", "live", "rft", "opts", "carry", "distil"):
        final = runs["fsdp"] / stage / "final"
        trained = weights(final)
        assert trained.keys() == base.keys(), stage  # LoRA merged: the base's own tensors, no adapter
        assert any(not torch.equal(trained[k], base[k]) for k in base), stage
        assert all(t.dtype == torch.float32 for t in trained.values()), stage  # bf16 in compute only
        assert logged(runs["fsdp"], stage)["result"]["tokens"] > 0
    assert logged(runs["fsdp"], "rft")["tables"] == ["samples/step-0000002.json"]  # generated on every rank
    assert logged(runs["fsdp"], "live")["tables"] == ["samples/step-0000002.json"]
    assert logged(runs["fsdp"], "sft")["tables"] == ["samples/step-0000003.json"]


@pytest.mark.slow
def test_a_crashed_fsdp_run_resumes_from_its_shards_bitwise(runs):
    base = runs["base"]
    out = runs["root"] / "crashed"
    config = {**base, "stages": stages(2)[:1], "parallelism": {"strategy": "fsdp"}, "out": str(out)}
    launch({**config, "crash_after": 5})  # steps 1-5 draw batches; step 6's crashes, after the step-4 checkpoint
    assert not (out / "cpt" / "final").exists()
    point = out / "cpt" / "checkpoints" / "step-0000004"
    assert sorted(p.name for p in point.iterdir()) == ["dcp", "forge_state.json", "manifest.json", "rng-0.pt",
                                                      "rng-1.pt", "training_state.pt"]
    assert not list(point.parent.glob("*.partial"))
    launch({**config, "resume": True})
    straight, resumed = weights(runs["fsdp"] / "cpt" / "final"), weights(out / "cpt" / "final")
    FIGURES["fsdp resumed vs uninterrupted, cpt weights"] = max((straight[k] - resumed[k]).abs().max().item()
                                                               for k in straight)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)  # bitwise
    assert series(out, "cpt", "loss") == series(runs["fsdp"], "cpt", "loss")[4:]  # steps 5 and 6, the same
    # on one process DCP reshards the two ranks' shards: the stage finishes, saying it is not bitwise
    other = runs["root"] / "one-process"
    shutil.copytree(out / "cpt" / "checkpoints", other / "cpt" / "checkpoints")
    printed = launch({**config, "out": str(other), "resume": True}, nproc=1)
    assert "written by 2 processes, resuming on 1: the model and optimizer shards are resharded" in printed
    assert [r["step"] for r in logged(other, "cpt")["rows"] if "loss" in r] == [5, 6]
    assert (other / "cpt" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_nodes_with_hybrid_sharding_equal_two_processes(runs):
    base = runs["base"]
    out = runs["root"] / "nodes"
    launch({**base, "stages": stages(2)[:1], "parallelism": {"strategy": "fsdp", "sharding": "hybrid"},
            "out": str(out)}, nodes=2)
    diff = max_diff(series(out, "cpt", "loss"), series(runs["fsdp"], "cpt", "loss"))
    FIGURES["2 nodes (hybrid) vs 2 processes (full), cpt loss"] = diff
    assert diff < TOL
    print("\nmax abs differences:", json.dumps(FIGURES, indent=1))
