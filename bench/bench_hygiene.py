"""Throughput of forge.data.hygiene on a JSONL QA file: records/s for PII only, dedup only, and all,
side by side with reading the records alone (JSON parsing included), and the ratio to it.

    python bench/bench_hygiene.py [path] [--repeats 3] [--quick]   # default: the medquad cancer.gov QA set

`--quick` (CI): the file's first 200 records, one repeat.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from benchlib import machine_line, print_table  # noqa: E402
from forge.data.hygiene import Hygiene, HygieneConfig  # noqa: E402

DEFAULT = Path("/work/shared/data/domain/medquad_cancergov/cancergov_qa.jsonl")


def _records(path: Path):
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                r = json.loads(line)
                yield i, f"{r['question']}\n{r['answer']}"


def bench_hygiene(path: str | Path = DEFAULT, repeats: int = 3) -> dict:
    """Best-of-`repeats` records/s for each mode (reading and JSON parsing included)."""
    path = Path(path)
    n_bytes = path.stat().st_size
    # A stand-in eval set: the last 50 records. They, and records sharing a 13-gram of their
    # boilerplate with them, count as contaminated in the "all" mode.
    eval_texts = [t for _, t in list(_records(path))[-50:]]
    modes = {
        "pii": (HygieneConfig(dedup="off", ngram=0), ()),
        "dedup_near": (HygieneConfig(pii="off", ngram=0), ()),
        "all": (HygieneConfig(), eval_texts),
    }
    out: dict = {"path": str(path), "mb": round(n_bytes / 1e6, 2)}
    best = float("inf")
    for _ in range(repeats):  # the baseline: reading and parsing alone
        t0 = time.perf_counter()
        n = sum(1 for _ in _records(path))
        best = min(best, time.perf_counter() - t0)
    out["read.records_per_s"] = round(n / best, 1)
    for name, (cfg, evals) in modes.items():
        best = float("inf")
        for _ in range(repeats):
            h = Hygiene(cfg, evals)
            t0 = time.perf_counter()
            kept = sum(1 for _ in h.process(path.stem, _records(path)))
            best = min(best, time.perf_counter() - t0)
        n = h.stats.records_in
        out[f"{name}.records_per_s"] = round(n / best, 1)
        out[f"{name}.mb_per_s"] = round(n_bytes / 1e6 / best, 2)
        out[f"{name}.kept"] = kept
        if name == "all":
            out["records"] = n
            out.update({k: v for k, v in h.stats.as_dict().items() if ".source." not in k and v})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the first 200 records, one repeat (CI)")
    args = ap.parse_args()
    if not args.path.is_file():
        sys.exit(f"{args.path} is absent (../shared/data is needed for this benchmark, or give a JSONL path)")
    path = args.path
    if args.quick:
        path = Path(tempfile.mkdtemp(prefix="forge-bench-hygiene-")) / args.path.name
        with open(args.path, encoding="utf-8") as f:
            path.write_text("".join(line for _, line in zip(range(200), f)))
    out = bench_hygiene(path, 1 if args.quick else args.repeats)
    for k, v in out.items():
        print(f"{k:32s} {v}")
    print(machine_line())
    read = out["read.records_per_s"]
    print_table("bench_hygiene", ["records/s", "÷ reading alone"],
                [[mode, out[f"{mode}.records_per_s"], out[f"{mode}.records_per_s"] / read]
                 for mode in ("read", "pii", "dedup_near", "all")])


if __name__ == "__main__":
    main()
