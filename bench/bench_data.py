"""Data-path throughput and SFT packing efficiency, side by side, on the medquad cancer.gov QA set.

    python bench/bench_data.py [--path cancergov_qa.jsonl] [--tokenizer stories260K] [--repeats 3]

(1) tokens/s of forge's pretraining path (source -> build_mixture -> packed blocks, JSON reading
    included) vs the fast tokenizer's raw batch-encode of the same texts (already in memory);
    each timing runs enough passes to take ~2 s, the two alternate and the best of each counts.
(2) hygiene records/s (bench_hygiene.py).
(3) SFT (question -> user, answer -> assistant, default chat template, seq_len 512): packing
    efficiency of best-fit decreasing vs sequential packing vs per-batch padding (batch 8).

    python bench/bench_data.py --workers 1,2 [--quick] [--size-mb 64] [--repeats 3]

(4) data preparation in worker processes (bench_workers.py): a generated support-ticket corpus
    (bench_memory.generate: PII, secrets, 5% exact and 5% near duplicates) cleaned, tokenized and
    packed at each worker count; records/s and tokens/s per phase side by side, the ratio, the identity
    of the outputs, and the hours projected for 10B tokens on a 64-core node and on 8 such nodes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from bench_hygiene import bench_hygiene  # noqa: E402
from forge.data.examples import sft_examples  # noqa: E402
from forge.data.formats import FormatSpec, FormatStats  # noqa: E402
from forge.data.mixing import eval_mixture  # noqa: E402
from forge.data.packing import pack_best_fit, pack_next_fit, packing_efficiency, pad_batches  # noqa: E402
from forge.inputs import resolve_source  # noqa: E402
from forge.recipe import DataSource  # noqa: E402

SHARED = Path("/work/shared/data")
DATA = SHARED / "domain/medquad_cancergov/cancergov_qa.jsonl"
TOKENIZER = SHARED / "models/stories260K"


def forge_pass(source, tok, seq_len: int) -> int:
    """One pass over every document: an evaluation mixture with holdout 1.0 reads each once."""
    everything = dataclasses.replace(source, holdout=1.0)
    mix = eval_mixture({"qa": everything}, {"qa": 1.0}, tok, seq_len, "eos")
    n = 0
    while mix.next_block() is not None:
        n += seq_len
    return n


def raw_pass(texts: list[str], tok) -> int:
    return sum(len(x) for x in tok(texts, add_special_tokens=False, verbose=False)["input_ids"])


def backend_pass(texts: list[str], tok) -> int:
    """The Rust tokenizer without transformers' wrapper (no offsets, no BatchEncoding): for context."""
    return sum(len(e.ids) for e in tok.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False))


def timed(fn, passes: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = sum(fn() for _ in range(passes))
    return time.perf_counter() - t0, tokens


def throughput(path: Path, tok, repeats: int, seq_len: int = 512) -> dict:
    source = resolve_source("qa", DataSource(path=str(path), text_field=["question", "answer"]),
                            Path(tempfile.mkdtemp(prefix="forge-bench-")))
    texts = [text for _, text in source.records()]
    forge_pass(source, tok, seq_len)  # warm up (file cache, tokenizer)
    dt, _ = timed(lambda: raw_pass(texts, tok), 1)
    passes = max(2, math.ceil(2.0 / dt))
    fns = {"forge": lambda: forge_pass(source, tok, seq_len), "raw": lambda: raw_pass(texts, tok),
           "backend": lambda: backend_pass(texts, tok)}
    best = dict.fromkeys(fns, 0.0)
    for _ in range(repeats):
        for name, fn in fns.items():
            secs, tokens = timed(fn, passes)
            best[name] = max(best[name], tokens / secs)
    return {"documents": len(texts), "passes_per_timing": passes,
            "forge_tokenize_pack_tok_per_s": round(best["forge"]), "raw_batch_encode_tok_per_s": round(best["raw"]),
            "ratio_forge_over_raw": round(best["forge"] / best["raw"], 3),
            "(context) rust_encode_batch_fast_tok_per_s": round(best["backend"])}


def sft_packing(path: Path, tok, seq_len: int = 512, batch: int = 8, policies=("drop", "truncate")) -> dict:
    out: dict = {}
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for policy in policies:
        spec = FormatSpec("prompt_completion", fields={"prompt": "question", "completion": "answer"}, too_long=policy)
        stats = FormatStats()
        t0 = time.perf_counter()
        rows = resolve_source("qa", DataSource(path=str(path)), path.parent).rows()
        examples = list(sft_examples(rows, tok, spec, seq_len, "qa", stats))
        secs = time.perf_counter() - t0
        best, naive = pack_best_fit(examples, seq_len, pad_id), pack_next_fit(examples, seq_len, pad_id)
        padded, pad_eff = pad_batches(examples, batch, pad_id)
        p = f"too_long={policy}."
        out.update({
            p + "records": stats.records, p + "examples": stats.examples, p + "dropped_too_long": stats.dropped_too_long,
            p + "truncated": stats.truncated, p + "sft_tokenize_records_per_s": round(stats.records / secs, 1),
            p + "best_fit.blocks": len(best), p + "best_fit.efficiency": round(packing_efficiency(best), 4),
            p + "sequential.blocks": len(naive), p + "sequential.efficiency": round(packing_efficiency(naive), 4),
            p + f"padding_batch{batch}.batches": len(padded), p + f"padding_batch{batch}.efficiency": round(pad_eff, 4),
            p + "best_fit_over_padding": round(packing_efficiency(best) / pad_eff, 3),
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", type=Path, default=DATA)
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", help="compare data preparation at these worker counts, e.g. 1,2")
    ap.add_argument("--quick", action="store_true", help="with --workers: an 8 MB corpus, one repeat")
    ap.add_argument("--size-mb", type=float, default=64.0, help="with --workers: the corpus size")
    args = ap.parse_args()
    if args.workers:
        from bench_workers import compare

        compare([int(w) for w in args.workers.split(",")], 8.0 if args.quick else args.size_mb,
                1 if args.quick else args.repeats, args.tokenizer)
        return
    for p in (args.path, args.tokenizer):
        if not p.exists():
            sys.exit(f"{p} is absent (../shared/data is needed for this benchmark)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    sections = {
        "(1) tokenize+pack vs raw batch-encode": throughput(args.path, tok, args.repeats),
        "(2) hygiene": {k: v for k, v in bench_hygiene(args.path).items() if "records_per_s" in k or k == "records"},
        "(3) SFT packing, seq_len 512": sft_packing(args.path, tok),
        "(3b) for context: SFT packing, seq_len 2048": sft_packing(args.path, tok, 2048, policies=("drop",)),
    }
    for title, rows in sections.items():
        print(title)
        for k, v in rows.items():
            print(f"  {k:44s} {v}")
    print(json.dumps({"ratio_forge_over_raw": sections["(1) tokenize+pack vs raw batch-encode"]["ratio_forge_over_raw"]}))


if __name__ == "__main__":
    main()
