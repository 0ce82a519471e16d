"""SFT throughput: forge's SFT stage vs a bare loop over the very packed batches forge trains on
(forward, backward, AdamW step; nothing else; once with denormal floats flushed in every thread as
forge's loop does on a CPU, which is the like-for-like figure, and once without), TRL `SFTTrainer` (its defaults) and Hugging Face
`Trainer`; same model (stories260K), data (MedQuAD as chat), batch, seq_len and steps; real
(non-pad) tokens per second of training time, the median of `--repeats` rounds run in turn (the
order rotating each round), and the ratios. Then SFT data preparation (chat template, assistant masks) in records/s and tokens/s
against the pretraining tokenize-and-pack path (bench_data.forge_pass).

    python bench/bench_sft.py [--steps 30] [--batch 8] [--seq-len 512] [--repeats 3] [--prep-only] [--quick]

`--quick` (CI): 2 steps of batch 2 at seq_len 128, one round, one preparation pass; the same table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from bench_data import DATA, TOKENIZER, forge_pass  # noqa: E402
from benchlib import machine_line, print_table, runs as every_run  # noqa: E402
from forge.data.examples import sft_examples  # noqa: E402
from forge.data.formats import FormatSpec, FormatStats  # noqa: E402
from forge.data.packing import pack_best_fit  # noqa: E402
from forge.inputs import resolve_source  # noqa: E402
from forge.recipe import DataSource, SftStage  # noqa: E402
from forge.train.denormals import flush_denormals  # noqa: E402

FIELDS = {"instruction": "question", "output": "answer"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sft_stage(args) -> SftStage:
    return SftStage(name="sft", kind="sft", data=["qa"], max_steps=args.steps, seq_len=args.seq_len,
                    batch_size=args.batch, optim={"lr": 1e-3}, checkpoint={"final_optimizer": False})


def qa_source(tmp: Path):
    return resolve_source("qa", DataSource(path=str(DATA), holdout=0.0,
                                          chat={"kind": "instruction", "fields": FIELDS, "too_long": "truncate"}), tmp)


def bench_forge(tmp: Path, args) -> float:
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    stage = sft_stage(args)
    r = KINDS["sft"].runner()(stage, StageInputs(TOKENIZER, {"qa": qa_source(tmp)}, tmp / "forge", null_tracker(),
                                                 log=lambda *_: None))
    return r.metrics["tokens"] / r.metrics["train_seconds"]


def bench_bare(tmp: Path, args, flushed: bool = True) -> float:
    """The packed batches forge's SFT stream hands out (same examples, seed and order), trained by
    a plain loop: forward with the packed position ids, backward, clip, AdamW step; `flushed`: with
    denormals flushed to zero in every thread, as forge.train.loop.fit does on a CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.data.packing import pad_token_id
    from forge.stages.sft import SftStream, load_examples

    stage, tok = sft_stage(args), AutoTokenizer.from_pretrained(TOKENIZER)
    examples, _, _ = load_examples(stage, {"qa": qa_source(tmp)}, tok, held_out=False)
    stream = SftStream(examples, stage.seq_len, stage.batch_size, stage.packing, pad_token_id(tok), stage.seed)
    batches = [stream.next_batch() for _ in range(args.steps)]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(TOKENIZER, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with flush_denormals(flushed):
        start = time.perf_counter()
        for b in batches:
            model(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["labels"],
                  use_cache=False).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return stream.real_tokens / (time.perf_counter() - start)


class RealTokens:
    """Counts non-pad tokens of the batches a Trainer trains on (its collator's attention mask).
    accelerate's data loader collates one batch ahead (to know which batch is the last), so a run of
    N steps collates N + 1 batches: only the first N are trained on, and only they count."""

    def __init__(self, collator):
        self.collator, self.per_batch = collator, []

    def __call__(self, features):
        batch = self.collator(features)
        self.per_batch.append(int(batch["attention_mask"].sum()) if "attention_mask" in batch
                              else batch["input_ids"].numel())
        return batch

    def trained(self, steps: int) -> int:
        if len(self.per_batch) < steps:
            raise RuntimeError(f"the trainer collated {len(self.per_batch)} batches for {steps} steps")
        return sum(self.per_batch[:steps])


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
    return counter.trained(args.steps) / out.metrics["train_runtime"]


def bench_hf(tmp: Path, args) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

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
    return counter.trained(args.steps) / out.metrics["train_runtime"]


def bench_prep(tmp: Path, seq_len: int, passes: int = 3) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    spec = FormatSpec("instruction", fields=FIELDS, too_long="truncate")
    src = resolve_source("qa", DataSource(path=str(DATA)), tmp)
    best_sft = best_pre = 0.0
    for _ in range(passes):
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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prep-only", action="store_true", help="only the data preparation timing")
    ap.add_argument("--quick", action="store_true", help="2 steps of batch 2 at seq_len 128, one round (CI)")
    args = ap.parse_args()
    if args.quick:
        args.__dict__.update(steps=2, batch=2, seq_len=128, repeats=1)
    for p in (DATA, TOKENIZER):
        if not p.exists():
            sys.exit(f"{p} is absent (../shared/data is needed for this benchmark)")
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-sft-"))
    if args.prep_only:
        print_prep(tmp, args.seq_len, 1 if args.quick else 3)
        return
    runs = {"forge (packed best-fit)": bench_forge, "bare loop (same packed batches)": bench_bare,
            "bare loop, denormals not flushed": lambda t, a: bench_bare(t, a, flushed=False),
            "TRL SFTTrainer defaults": bench_trl, "HF Trainer (padded)": bench_hf}
    got: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.repeats):  # in turn, so a noisy spell hits every contender alike; the order
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotates: the first run of a
            got[name].append(runs[name](tmp / f"r{r}", args))          # process (its warm-up) is shared
    tps = {name: statistics.median(v) for name, v in got.items()}
    forge = tps["forge (packed best-fit)"]
    print(f"SFT, stories260K, MedQuAD chat, batch {args.batch}, seq_len {args.seq_len}, {args.steps} steps (CPU), "
          f"median of {args.repeats}")
    for name, v in tps.items():
        print(f"  {name:32s} {v:12,.0f} real tok/s   forge / this = {forge / v:.2f}x   (runs: "
              + ", ".join(f"{x:,.0f}" for x in got[name]) + ")")
    prep = print_prep(tmp, args.seq_len, 1 if args.quick else 3)
    print(machine_line())
    print_table("bench_sft", ["real tokens/s", "forge ÷ this", "runs (real tokens/s)"],
                [[name, v, forge / v, every_run(got[name], "{:,.0f}")] for name, v in tps.items()]
                + [["data prep: pretraining tokenize+pack ÷ SFT template+masks+packing, per token", "",
                    prep["pretrain_over_sft_per_token"], ""]])


def print_prep(tmp: Path, seq_len: int, passes: int) -> dict:
    print(f"SFT data preparation vs the pretraining tokenize-and-pack path (MedQuAD, seq_len {seq_len})")
    figures = bench_prep(tmp, seq_len, passes)
    for k, v in figures.items():
        print(f"  {k:44s} {v}")
    return figures


if __name__ == "__main__":
    main()
