"""Peak memory of forge's data path against corpus size: does it stream?

Generates a proprietary-looking JSONL corpus (support tickets with emails, phone numbers, keys,
exact and near duplicates) of each size, then in a fresh subprocess per size runs what
`pipelines/novella.py` runs before training: read -> hygiene (PII redaction, exact + near dedup)
-> cleaned cache, then tokenize -> mix (90% corpus, 10% general text) -> pack into blocks, until
the corpus is used up. Prints peak RSS per phase (Linux VmHWM, reset between phases) and the
ratio of the largest corpus to the smallest.

    python bench/bench_memory.py                 # 0.1 GB and 1 GB (the 1 GB run takes a while)
    python bench/bench_memory.py --sizes 0.01 0.05 --workdir /tmp/forge-bench-mem
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _vocab(rng: random.Random, n: int = 5000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(n)]


def generate(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Write tickets until the file reaches `target_bytes`; ~5% exact and ~5% near duplicates."""
    rng = random.Random(seed)
    vocab = _vocab(rng)
    recent: list[str] = []
    n = written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_bytes:
            n += 1
            roll = rng.random()
            if recent and roll < 0.05:
                body = rng.choice(recent)                        # exact duplicate
            elif recent and roll < 0.10:
                words = rng.choice(recent).split(" ")
                words[rng.randrange(len(words))] = rng.choice(vocab)
                body = " ".join(words)                           # near duplicate (one word changed)
            else:
                body = " ".join(rng.choices(vocab, k=rng.randint(80, 220)))
                if rng.random() < 0.3:
                    body += f" Contact customer{n}@example.com or call (555) 201-{n % 10000:04d}."
                if rng.random() < 0.02:
                    body += f" Deploy key AKIA{rng.getrandbits(64):016X}"[:41]
                recent.append(body)
                if len(recent) > 1000:
                    recent.pop(0)
            line = json.dumps({"ticket": n, "body": body}) + "\n"
            f.write(line)
            written += len(line)
    return n


def _peak_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak RSS (VmHWM), Linux >= 4.0
        f.write("5")


def _peak_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(corpus: Path, work: Path) -> dict:
    """Run the data path over `corpus`; return per-phase peak RSS (MB) and counts."""
    from forge.data.hygiene import HygieneConfig
    from forge.data.mixing import build_mixture
    from forge.data.prepare import clean_sources
    from forge.inputs import resolve_source
    from forge.recipe import DataSource, GeneratedText
    from forge.scratch import train_tokenizer

    out: dict = {"baseline_mb": round(_peak_mb(), 1)}
    cfgs = {"crm": DataSource(path=str(corpus), text_field="body", proprietary=True, holdout=0.0),
            "general": DataSource(generate=GeneratedText(kind="stories", documents=2000), holdout=0.0)}
    raw = {n: resolve_source(n, c, work) for n, c in cfgs.items()}

    _peak_reset()
    t0 = time.perf_counter()
    fingerprints = {n: s.fingerprint() for n, s in raw.items()}
    sources, stats = clean_sources(HygieneConfig(), raw, ["crm"], fingerprints, work)
    out["hygiene_s"] = round(time.perf_counter() - t0, 1)
    out["hygiene_peak_mb"] = round(_peak_mb(), 1)
    out["records_in"], out["records_out"] = stats["hygiene.records_in"], stats["hygiene.records_out"]
    out["near_dups"], out["exact_dups"] = stats["hygiene.near_dups"], stats["hygiene.exact_dups"]

    _peak_reset()
    t0 = time.perf_counter()
    tokenizer = train_tokenizer([raw["general"]], vocab_size=1024, max_docs=2000)
    mix = build_mixture(sources, {"crm": 0.9, "general": 0.1}, tokenizer, seq_len=256, separator="eos",
                        max_repeats=0, on_exhausted="rebalance")
    blocks = 0
    while mix.next_block() is not None:
        blocks += 1
    out["mix_pack_s"] = round(time.perf_counter() - t0, 1)
    out["mix_pack_peak_mb"] = round(_peak_mb(), 1)
    out["blocks"] = blocks
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1.0], help="corpus sizes in GB")
    ap.add_argument("--workdir", type=Path, default=None, help="where corpora go (default: a temp dir, removed)")
    ap.add_argument("--quick", action="store_true", help="2 MB and 4 MB corpora (the script's own check)")
    ap.add_argument("--child", nargs=2, metavar=("CORPUS", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]))))
        return
    if args.quick:
        args.sizes = [0.002, 0.004]
    root = args.workdir or Path(tempfile.mkdtemp(prefix="forge-bench-mem-"))
    root.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        for gb in args.sizes:
            corpus = root / f"corpus-{gb:g}GB.jsonl"
            if not corpus.is_file():
                generate(corpus, int(gb * 1e9))
            work = root / f"work-{gb:g}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            proc = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(work)],
                                  capture_output=True, text=True, check=True)
            results[gb] = r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{gb:g} GB: " + ", ".join(f"{k}={v}" for k, v in r.items()), flush=True)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    small, big = results[min(results)], results[max(results)]
    for phase in ("hygiene_peak_mb", "mix_pack_peak_mb"):
        print(f"{phase:18s} {min(results):g} GB: {small[phase]:8.1f}  {max(results):g} GB: {big[phase]:8.1f}  "
              f"ratio {big[phase] / small[phase]:.2f}x (corpus {max(results) / min(results):g}x)")


if __name__ == "__main__":
    main()
