"""SFT throughput: forge's SFT stage vs TRL `SFTTrainer` (its defaults) vs Hugging Face `Trainer`, same
model (stories260K), data (MedQuAD as chat), batch, seq_len and steps; real (non-pad) tokens per
second and the ratios. Then SFT data preparation (chat template, assistant masks) in records/s and
tokens/s against the pretraining tokenize-and-pack path (bench_data.forge_pass).

    python bench/bench_sft.py [--steps 30] [--batch 8] [--seq-len 512] [--prep-only]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from bench_data import DATA, TOKENIZER, forge_pass  # noqa: E402
from forge.data.examples import sft_examples  # noqa: E402
from forge.data.formats import FormatSpec, FormatStats  # noqa: E402
from forge.data.packing import pack_best_fit  # noqa: E402
from forge.inputs import resolve_source  # noqa: E402
from forge.recipe import DataSource, SftStage  # noqa: E402

FIELDS = {"instruction": "question", "output": "answer"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench_forge(tmp: Path, args) -> float:
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    src = resolve_source("qa", DataSource(path=str(DATA), holdout=0.0,
                                          chat={"kind": "instruction", "fields": FIELDS, "too_long": "truncate"}), tmp)
    stage = SftStage(name="sft", kind="sft", data=["qa"], max_steps=args.steps, seq_len=args.seq_len,
                     batch_size=args.batch, optim={"lr": 1e-3}, checkpoint={"final_optimizer": False})
    r = KINDS["sft"].runner()(stage, StageInputs(TOKENIZER, {"qa": src}, tmp / "forge", null_tracker(), log=lambda *_: None))
    return r.metrics["tokens"] / r.metrics["train_seconds"]


class RealTokens:
    """Counts non-pad tokens of the batches a Trainer trains on (its collator's attention mask)."""

    def __init__(self, collator):
        self.collator, self.tokens = collator, 0

    def __call__(self, features):
        batch = self.collator(features)
        self.tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
        return batch


def bench_trl(tmp: Path, args) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from forge.data.formats import DEFAULT_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    tok.chat_template = DEFAULT_CHAT_TEMPLATE
    ds = Dataset.from_list([{"messages": [{"role": "user", "content": r["question"]},
                                          {"role": "assistant", "content": r["answer"]}]} for r in rows(DATA)])
    cfg = SFTConfig(output_dir=str(tmp / "trl"), max_steps=args.steps, per_device_train_batch_size=args.batch,
                    max_length=args.seq_len, learning_rate=1e-3, report_to=[], use_cpu=True, bf16=False,
                    save_strategy="no", logging_steps=10_000, dataloader_num_workers=0)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(TOKENIZER), args=cfg, train_dataset=ds,
                         processing_class=tok)
    counter = RealTokens(trainer.data_collator)
    trainer.data_collator = counter
    out = trainer.train()
    return counter.tokens / out.metrics["train_runtime"]


def bench_hf(tmp: Path, args) -> float:
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer,
                              TrainingArguments)

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    tok.pad_token = tok.pad_token or tok.eos_token
    spec = FormatSpec("instruction", fields=FIELDS, too_long="truncate")
    src = resolve_source("qa", DataSource(path=str(DATA)), tmp)
    ex = list(sft_examples(src.rows(), tok, spec, args.seq_len, "qa", FormatStats()))
    targs = TrainingArguments(output_dir=str(tmp / "hf"), max_steps=args.steps, per_device_train_batch_size=args.batch,
                              learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
                              logging_steps=10_000, dataloader_num_workers=0)
    counter = RealTokens(DataCollatorForSeq2Seq(tok, padding=True))
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(TOKENIZER), args=targs,
                      train_dataset=Dataset.from_list(ex), data_collator=counter)
    out = trainer.train()
    return counter.tokens / out.metrics["train_runtime"]


def bench_prep(tmp: Path, seq_len: int) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    spec = FormatSpec("instruction", fields=FIELDS, too_long="truncate")
    src = resolve_source("qa", DataSource(path=str(DATA)), tmp)
    best_sft = best_pre = 0.0
    for _ in range(3):
        stats = FormatStats()
        t0 = time.perf_counter()
        pack_best_fit(list(sft_examples(src.rows(), tok, spec, seq_len, "qa", stats)), seq_len, tok.eos_token_id)
        sft_s = time.perf_counter() - t0
        best_sft = max(best_sft, stats.tokens / sft_s)
        t0 = time.perf_counter()
        n = forge_pass(resolve_source("qa", DataSource(path=str(DATA), text_field=["question", "answer"]), tmp), tok, seq_len)
        best_pre = max(best_pre, n / (time.perf_counter() - t0))
    return {"sft_records_per_s (best)": round(stats.records * best_sft / stats.tokens),
            "sft_tokens_per_s (template, masks, packing)": round(best_sft),
            "pretrain_tokenize_pack_tokens_per_s": round(best_pre), "pretrain_over_sft_per_token": round(best_pre / best_sft, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--prep-only", action="store_true", help="only the data preparation timing")
    args = ap.parse_args()
    for p in (DATA, TOKENIZER):
        if not p.exists():
            sys.exit(f"{p} is absent (../shared/data is needed for this benchmark)")
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-sft-"))
    if args.prep_only:
        return print_prep(tmp, args.seq_len)
    tps = {"forge (packed best-fit)": bench_forge(tmp, args), "TRL SFTTrainer defaults": bench_trl(tmp, args),
           "HF Trainer (padded)": bench_hf(tmp, args)}
    print(f"SFT, stories260K, MedQuAD chat, batch {args.batch}, seq_len {args.seq_len}, {args.steps} steps (CPU)")
    for name, v in tps.items():
        print(f"  {name:28s} {v:12,.0f} real tok/s   forge / this = {tps['forge (packed best-fit)'] / v:.2f}x")
    print_prep(tmp, args.seq_len)


def print_prep(tmp: Path, seq_len: int) -> None:
    print(f"SFT data preparation vs the pretraining tokenize-and-pack path (MedQuAD, seq_len {seq_len})")
    for k, v in bench_prep(tmp, seq_len).items():
        print(f"  {k:44s} {v}")


if __name__ == "__main__":
    main()
