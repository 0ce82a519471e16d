"""DPO stage: the loss equals TRL's DPOTrainer on the same batch and weights, cached and live
references give the same loss, and training raises held-out reward margin and accuracy."""
from __future__ import annotations

import json

import pytest
import torch

from forge.inputs import resolve_source
from forge.recipe import DataSource, DpoStage
from forge.stages.dpo import pair_logps
from forge.train.preference import dpo_loss
from forge_testing import run_stage, shared_path
from sft_fixtures import THINGS, TRAIN_PHRASINGS


def write_pairs(path, repeats=2):
    """Answer the question (chosen) rather than dodge it (rejected)."""
    rows = [{"prompt": p.format(t=t), "chosen": f"It is {c}.", "rejected": "I do not know."}
            for _ in range(repeats) for t, c in THINGS.items() for p in TRAIN_PHRASINGS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pair_source(tmp_path, holdout=0.25):
    return resolve_source("prefs", DataSource(path=str(write_pairs(tmp_path / "prefs.jsonl")), holdout=holdout,
                                              chat={"kind": "preference"}), tmp_path)


def dpo(**kw) -> DpoStage:
    cfg = {"name": "dpo", "kind": "dpo", "data": ["prefs"], "max_steps": 4, "seq_len": 64, "batch_size": 4,
           "beta": 0.5, "optim": {"lr": 1e-3}, "schedule": {"kind": "constant"}}
    cfg.update(kw)
    return DpoStage(**cfg)


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_dpo_loss_equals_trl(tmp_path, tiny_checkpoint, loss):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    policy, ref = (AutoModelForCausalLM.from_pretrained(tiny_checkpoint) for _ in range(2))
    torch.manual_seed(0)
    with torch.no_grad():  # a policy away from its reference, so the loss is not log 2
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ds = Dataset.from_list([{"prompt": "What color is the sky?", "chosen": " blue", "rejected": " green and red"},
                            {"prompt": "Name a fruit.", "chosen": " an apple please", "rejected": " coal"},
                            {"prompt": "Say hi.", "chosen": " hi there", "rejected": " no"}])
    args = DPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], beta=0.3, loss_type=[loss],
                     per_device_train_batch_size=3, max_length=64, bf16=False, use_cpu=True)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=ds, processing_class=tok)
    batch = next(iter(trainer.get_train_dataloader()))
    policy.eval()
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, batch).item()
        ours_batch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                      "labels": batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)}
        logps, tokens = pair_logps(policy, ours_batch, "cpu")
        ref_logps, _ = pair_logps(ref, ours_batch, "cpu")
        ours = dpo_loss(logps, ref_logps, 0.3, 0.0, loss, tokens).loss.item()
    assert abs(ours - theirs) < 1e-5, (ours, theirs)
    assert abs(ours - (0.6931 if loss == "sigmoid" else 1 / 0.6 ** 2)) > 1e-3  # not the trivial value


def test_label_smoothing_is_conservative_dpo():
    """cDPO (TRL <= 0.x `sigmoid` with label_smoothing; TRL 1.x dropped ε from `sigmoid`): transcribed."""
    c, r, rc, rr = (torch.tensor([x]) for x in (-3.0, -5.0, -4.0, -4.5))
    delta = 0.2 * ((c - rc) - (r - rr))
    want = -(0.9 * torch.nn.functional.logsigmoid(delta) + 0.1 * torch.nn.functional.logsigmoid(-delta))
    policy, reference = torch.stack([c, r], dim=1), torch.stack([rc, rr], dim=1)
    assert torch.allclose(dpo_loss(policy, reference, 0.2, 0.1).loss, want.mean())
    assert dpo_loss(policy, reference, 0.2, 0.1).loss > dpo_loss(policy, reference, 0.2, 0.0).loss


def test_cached_and_live_reference_give_the_same_loss(tmp_path, tiny_checkpoint):
    src = {"prefs": pair_source(tmp_path)}
    cached = run_stage(dpo(max_steps=2), tiny_checkpoint, src, tmp_path / "c")
    live = run_stage(dpo(max_steps=2, reference="live"), tiny_checkpoint, src, tmp_path / "l")
    assert (tmp_path / "c" / "reference_logps.pt").is_file() and not (tmp_path / "l" / "reference_logps.pt").exists()
    for k in ("loss", "eval_loss", "eval_rewards/margin"):
        assert abs(cached.metrics[k] - live.metrics[k]) < 1e-5, k
    assert cached.metrics["eval_loss_start"] == pytest.approx(0.6931, abs=1e-3)  # policy == reference


def test_dpo_raises_held_out_margin_and_accuracy(tmp_path, tiny_checkpoint):
    result = run_stage(dpo(max_steps=12, batch_size=8), tiny_checkpoint, {"prefs": pair_source(tmp_path)}, tmp_path / "o")
    m = result.metrics
    print({k: round(v, 3) for k, v in m.items() if "eval" in k})
    assert m["eval_rewards/margin_start"] == pytest.approx(0.0, abs=1e-5)
    assert m["eval_rewards/margin"] > 1.0 and m["eval_rewards/accuracy"] >= 0.9
    assert m["eval_loss"] < m["eval_loss_start"] - 0.3


@pytest.mark.slow
def test_dpo_on_hh_rlhf_harmless_raises_held_out_margin_and_accuracy(tmp_path):
    """Real pairs on a real (tiny) model: stories260K (TinyStories, vocab 512) trained with DPO on
    HH-RLHF harmless pairs prefers the chosen reply more often on pairs it never saw, and the
    held-out DPO loss falls below log 2. A small effect, as for any model: a unigram classifier on
    these replies reaches 0.59 held-out, reply length alone 0.55. It needs many held-out pairs to
    measure (here 156), a gentle update and large batches (one epoch of 32-pair steps): at lr 2e-4
    the held-out margins spread, the loss rises and accuracy drifts back to 0.5 within 20 steps;
    with 8-pair batches one data order in five (seed 3) went the wrong way.
    Measured at the end (data orders, seeds 0 / 1 / 2 / 3): held-out accuracy 0.519 / 0.564 / 0.558 /
    0.564, margin 0.035 / 0.066 / 0.062 / 0.037, loss 0.6895 / 0.6735 / 0.6758 / 0.6846 (log 2 =
    0.6931) on 156 pairs."""
    import gzip

    model = shared_path("models", "stories260K")
    lines = gzip.open(shared_path("preference", "hh_rlhf_harmless", "test.jsonl.gz"), "rt").readlines()
    data = tmp_path / "hh.jsonl"
    data.write_text("".join(lines[:1100]))  # ~360 pairs fit in 256 tokens: ~205 to train on, ~156 held out
    src = resolve_source("hh", DataSource(path=str(data), holdout=0.45, chat={"kind": "hh"}, on_error="skip"), tmp_path)
    stage = dpo(data=["hh"], max_steps=6, seq_len=256, batch_size=32, beta=0.1, optim={"lr": 5e-5},
                eval={"max_blocks": 100}, seed=0)
    m = run_stage(stage, model, {"hh": src}, tmp_path / "o").metrics
    print({k: round(v, 4) for k, v in m.items() if "eval" in k or k.endswith("_pairs")})
    assert m["train_pairs"] > 150 and m["heldout_pairs"] > 120 and (tmp_path / "o" / "reference_logps.pt").is_file()
    assert m["eval_rewards/margin_start"] == pytest.approx(0.0, abs=1e-5)
    assert m["eval_rewards/margin"] > 0.01 and m["eval_rewards/accuracy"] > 0.5
    assert m["eval_loss"] < m["eval_loss_start"] - 0.002


@pytest.mark.slow
def test_sample_tables_reach_mlflow_with_pairs_generations_and_implicit_rewards(tmp_path, tiny_checkpoint):
    """Every samples.every steps: an MLflow table of prompt, chosen, rejected, the policy's completion
    and the implicit rewards; cached and live references give the same rewards."""
    import mlflow

    from forge.track import MlflowTracker as Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "dpo-samples")
    tables = {}
    for mode in ("cached", "live"):
        stage = dpo(max_steps=4, reference=mode, samples={"every": 2, "prompts": 3, "max_new_tokens": 4})
        with tracker.run(f"dpo-{mode}") as run_id:
            run_stage(stage, tiny_checkpoint, {"prefs": pair_source(tmp_path)}, tmp_path / mode, tracker=tracker)
        client = mlflow.MlflowClient()
        assert sorted(a.path for a in client.list_artifacts(run_id, "samples")) == [
            "samples/step-0000002.json", "samples/step-0000004.json"]
        tables[mode] = [mlflow.load_table(f"samples/step-{s:07d}.json", run_ids=[run_id]) for s in (2, 4)]
    for t in tables["cached"]:
        assert list(t.columns) == ["step", "prompt", "completion", "chosen", "rejected", "reward_chosen",
                                   "reward_rejected", "margin"]
        assert len(t) == 3 and all(c.startswith("It is ") for c in t["chosen"])
        assert set(t["rejected"]) == {"I do not know."} and all("color" in p for p in t["prompt"])
        assert all(isinstance(c, str) for c in t["completion"])
        assert ((t["margin"] - (t["reward_chosen"] - t["reward_rejected"])).abs() < 1e-6).all()
    late = tables["cached"][1]
    assert late["margin"].abs().max() > 1e-3  # the policy has moved away from the reference by step 4
    for a, b in zip(tables["cached"], tables["live"]):
        assert ((a["margin"] - b["margin"]).abs() < 1e-4).all()
