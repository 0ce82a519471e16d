"""Throughput of forge.data.hygiene on a JSONL QA file: records/s for PII only, dedup only, and all.

    python bench/bench_hygiene.py [path]   # default: the medquad cancer.gov QA set
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from forge.data.hygiene import Hygiene, HygieneConfig

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


if __name__ == "__main__":
    for k, v in bench_hygiene(sys.argv[1] if len(sys.argv) > 1 else DEFAULT).items():
        print(f"{k:32s} {v}")
