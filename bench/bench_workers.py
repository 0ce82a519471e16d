"""Data preparation at several worker counts, side by side (bench_data.py --workers 1,2 runs it).

Each repeat, for each worker count, in a fresh folder: hygiene (clean_sources: PII/secret redaction,
decontamination off, exact and near dedup: records/s), tokenization into the token cache (tokens/s)
and mixing+packing of every block from it (tokens/s: what a launch does now, forge.data.mixing.launch_mixture:
rank 0 plans the blocks' layout once, then the rank cuts its blocks, 16 a batch, from the cache). The median of
the repeats per phase; the ratio to the first worker count; whether the cleaned cache and the blocks
are byte-identical across worker counts; and the hours projected for 10B tokens. On a shared machine
wall-clock rates follow the others' load, so each phase also gives its CPU seconds (every process)
and the rate its CPU time allows on idle cores (the main process's share alone, the workers' share
spread over the cores): what the code costs, whatever the neighbours do.
"""
from __future__ import annotations

import hashlib
import os
import resource
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench_memory import generate

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core a worker: the rates are per core


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its ended children (the workers, once their pool ends)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _bound(before: tuple[float, float], workers: int) -> tuple[float, float]:
    """(CPU seconds of the phase, all processes; the shortest wall time it allows on `workers` idle
    cores: the main process's own share runs alone, the workers' share spreads over the cores)."""
    after = _cpu()
    me, kids = after[0] - before[0], after[1] - before[1]
    return me + kids, max(me, (me + kids) / workers) if workers > 1 else me + kids


def _one(corpus: Path, work: Path, workers: int, tok) -> dict:
    from forge.data.blocks import Ranks
    from forge.data.hygiene import HygieneConfig
    from forge.data.mixing import Mix, build_mixture, launch_mixture
    from forge.data.parallel import PrepareConfig
    from forge.data.prepare import clean_sources
    from forge.data.tokencache import token_cache
    from forge.inputs import resolve_source
    from forge.recipe import DataSource

    src = {"crm": resolve_source("crm", DataSource(path=str(corpus), text_field="body", holdout=0.0), work)}
    t0, c0 = time.perf_counter(), _cpu()
    cleaned, stats = clean_sources(HygieneConfig(), src, ["crm"], {"crm": "bench"}, work, PrepareConfig(workers))
    hyg, (hyg_cpu, hyg_bound) = time.perf_counter() - t0, _bound(c0, workers)
    from forge.data.cleanshards import clean_in_shards

    peak = getattr(clean_in_shards, "peak_mb", 0.0)
    crm = replace(cleaned["crm"], token_dir=work / "tokens", workers=workers)
    t0, c0 = time.perf_counter(), _cpu()
    token_cache(crm, tok, work / "tokens", workers)
    enc, (enc_cpu, enc_bound) = time.perf_counter() - t0, _bound(c0, workers)
    counted = build_mixture({"crm": crm}, {"crm": 1.0}, tok, 1024, "eos", max_repeats=0, on_exhausted="rebalance")
    blocks = 0
    while counted.plan.block() is not None:  # how many blocks the corpus fills (untimed: a launch knows its budget)
        blocks += 1
    blocks -= blocks % 16
    t0, c0 = time.perf_counter(), _cpu()
    mix = launch_mixture({"crm": crm}, Mix({"crm": 1.0}, 1024, "eos", 0, "rebalance"), tok, blocks, Ranks(work / "blocks"))
    digest = hashlib.sha256()
    for _ in range(blocks // 16):
        digest.update(mix.next_batch(16).numpy().tobytes())
    pack, (_, pack_bound) = time.perf_counter() - t0, _bound(c0, 1)
    tokens = blocks * 1024
    cache = hashlib.sha256(cleaned["crm"].files[0].read_bytes()).hexdigest()
    return {"hygiene records/s": stats["hygiene.records_in"] / hyg, "tokenize tokens/s": tokens / enc,
            "mix+pack tokens/s": tokens / pack, "tokenize+pack tokens/s": tokens / (enc + pack),
            "_ids": (cache, digest.hexdigest(), stats["hygiene.records_out"]), "_tokens": tokens,
            "hygiene peak MB a worker": peak, "hygiene CPU s": hyg_cpu, "tokenize CPU s": enc_cpu,
            "hygiene records/s, idle cores": stats["hygiene.records_in"] / hyg_bound,
            "tokenize+pack tokens/s, idle cores": tokens / (enc_bound + pack_bound),
            "_records": stats["hygiene.records_in"], "_bytes": corpus.stat().st_size}


def compare(counts: list[int], size_mb: float, repeats: int, tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    root = Path(tempfile.mkdtemp(prefix="forge-bench-workers-"))
    try:
        corpus = root / "tickets.jsonl"
        generate(corpus, int(size_mb * 1e6))
        print(f"corpus: {corpus.stat().st_size / 1e6:.1f} MB of support tickets; load average before {_load()} "
              f"({os.cpu_count()} CPUs)", flush=True)
        runs: dict[int, list[dict]] = {n: [] for n in counts}
        for r in range(repeats):
            for n in counts:
                work = root / f"w{n}-r{r}"
                runs[n].append(_one(corpus, work, n, tok))
                shutil.rmtree(work, ignore_errors=True)
                print(f"  repeat {r + 1}, {n} worker(s): " + ", ".join(
                    f"{k} {v:,.0f}" for k, v in runs[n][-1].items() if not k.startswith("_")) + f"; load {_load()}",
                    flush=True)
        _report(counts, runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _report(counts: list[int], runs: dict[int, list[dict]]) -> None:
    phases = [k for k in runs[counts[0]][0] if not k.startswith("_")]
    med = {n: {k: statistics.median(r[k] for r in runs[n]) for k in phases} for n in counts}
    print(f"\n{'phase (median of ' + str(len(runs[counts[0]])) + ')':28s}" + "".join(f"{f'{n} worker(s)':>16s}" for n in counts)
          + "".join(f"{f'ratio {n}/{counts[0]}':>14s}" for n in counts[1:]))
    for k in phases:
        print(f"{k:28s}" + "".join(f"{med[n][k]:16,.0f}" for n in counts)
              + "".join(f"{med[n][k] / med[counts[0]][k]:14.2f}" for n in counts[1:]))
    ids = {runs[n][i]["_ids"] for n in counts for i in range(len(runs[n]))}
    print(f"identical output (cleaned cache sha256, blocks sha256, records kept) at {counts} workers: "
          f"{'yes' if len(ids) == 1 else 'NO: ' + str(ids)}")
    _project(counts, med, runs)
    print(f"load average after: {_load()}")


def _project(counts: list[int], med: dict, runs: dict) -> None:
    """10B tokens: per-core rates from the largest worker count measured (rate / workers), scaled to 64
    cores a node; the shuffle (digests and band keys, 240 B a record) over a 10 Gb/s link between
    nodes; mixing+packing: rank 0 plans the layout once, each rank cuts its own share (item 4)."""
    n = counts[-1]
    r = runs[n][0]
    tok_per_record = r["_tokens"] / max(1, r["_records"])  # kept records' tokens per record read
    records = 10e9 / tok_per_record
    hyg_core = med[n]["hygiene records/s"] / n
    enc_core = med[n]["tokenize tokens/s"] / n
    pack = med[n]["mix+pack tokens/s"]
    shuffle_s = records * 240 / 1.25e9
    print(f"projection for 10B tokens ({records / 1e6:,.0f}M records at {tok_per_record:,.0f} tokens each; per-core "
          f"rates from {n} worker(s)):")
    for nodes in (1, 8):
        cores = 64 * nodes
        hyg = records / (hyg_core * cores) + (shuffle_s if nodes > 1 else 0)
        enc = 10e9 / (enc_core * cores)
        print(f"  {nodes} node(s), {cores} cores: hygiene {hyg / 3600:.2f} h, tokenize {enc / 3600:.2f} h, "
              f"mix+pack (one process) {10e9 / pack / 3600:.2f} h"
              + (f", shuffle {shuffle_s:.0f} s at 10 Gb/s" if nodes > 1 else ""))
