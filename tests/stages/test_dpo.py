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
        ours = dpo_loss(logps[:, 0], logps[:, 1], ref_logps[:, 0], ref_logps[:, 1], 0.3, 0.0, loss,
                        tokens[:, 0], tokens[:, 1]).loss.item()
    assert abs(ours - theirs) < 1e-5, (ours, theirs)
    assert abs(ours - (0.6931 if loss == "sigmoid" else 1 / 0.6 ** 2)) > 1e-3  # not the trivial value


def test_label_smoothing_is_conservative_dpo():
    """cDPO (TRL <= 0.x `sigmoid` with label_smoothing; TRL 1.x dropped ε from `sigmoid`): transcribed."""
    c, r, rc, rr = (torch.tensor([x]) for x in (-3.0, -5.0, -4.0, -4.5))
    delta = 0.2 * ((c - rc) - (r - rr))
    want = -(0.9 * torch.nn.functional.logsigmoid(delta) + 0.1 * torch.nn.functional.logsigmoid(-delta))
    assert torch.allclose(dpo_loss(c, r, rc, rr, 0.2, 0.1).loss, want.mean())
    assert dpo_loss(c, r, rc, rr, 0.2, 0.1).loss > dpo_loss(c, r, rc, rr, 0.2, 0.0).loss


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
def test_dpo_on_hh_rlhf_harmless_with_stories260k(tmp_path):
    """Real pairs on a real (tiny) model: the pairs parse, the reference is cached, and the policy
    learns the pairs it trains on. Held-out margin is printed, not asserted: at this CPU budget
    stories260K (trained on TinyStories) does not generalise on HH-harmless (see the report)."""
    import gzip

    model = shared_path("models", "stories260K")
    lines = gzip.open(shared_path("preference", "hh_rlhf_harmless", "test.jsonl.gz"), "rt").readlines()
    data = tmp_path / "hh.jsonl"
    data.write_text("".join(lines[:200]))  # a CPU-sized sample of the 2,312 pairs: 2+ epochs in 20 steps
    src = resolve_source("hh", DataSource(path=str(data), holdout=0.1, chat={"kind": "hh"}, on_error="skip"), tmp_path)
    stage = dpo(data=["hh"], max_steps=20, seq_len=384, batch_size=8, beta=0.1, optim={"lr": 2e-4},
                eval={"max_blocks": 8})
    rows = []

    class Rows:
        def log_metrics(self, m, step=None):
            if "rewards/margin" in m:
                rows.append(m)

        def __getattr__(self, name):
            return lambda *a, **k: None

    m = run_stage(stage, model, {"hh": src}, tmp_path / "o", tracker=Rows()).metrics
    print({k: round(v, 3) for k, v in m.items() if "eval" in k or k == "train_pairs"})
    assert m["train_pairs"] > 60 and (tmp_path / "o" / "reference_logps.pt").is_file()
    late = rows[-5:]
    assert sum(r["rewards/margin"] for r in late) / len(late) > 0.05
    assert sum(r["rewards/accuracy"] for r in late) / len(late) > 0.6
