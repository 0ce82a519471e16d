"""Causal attention's forward and backward on this machine: transformers' SDPA call (`is_causal=True`,
the whole row at once) against forge's (forge.train.attention.causal_sdpa: on a CPU, rows of 2
query blocks to 512 tokens one query block at a time, each against the keys up to its end), at
the shapes forge trains tiny and small models on: head_dim 8 (stories260K, bench_sft), 32
(forge-tiny), 64 and 128, rows of 256 to 1024 tokens. Random (batch, heads, seq, head_dim) float32
tensors; the same tensors for both; ms per forward+backward, the median of `--repeats` rounds
alternating the two, and the ratio. Rows past 512 tokens show the kernel's own causal skipping
(forge leaves them alone).

    python bench/bench_attention.py [--repeats 3] [--quick]

`--quick` (CI): two shapes, one round.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from benchlib import machine_line, print_table, runs as every_run  # noqa: E402
from forge.train.attention import causal_sdpa  # noqa: E402

# (head_dim, heads, rows, seq_len): about 4k-8k tokens a call, as a training micro-batch
SHAPES = [(8, 8, 8, 512), (8, 8, 16, 256), (32, 4, 8, 512), (32, 4, 16, 256), (64, 4, 8, 512),
          (128, 2, 8, 512), (64, 4, 4, 1024)]
QUICK = [(8, 8, 4, 256), (32, 4, 2, 512)]


class Module:  # what transformers' SDPA reads of an attention layer
    is_causal, num_key_value_groups = True, 1


def fwd_bwd_ms(fn, q, k, v, steps: int) -> float:

    def once():
        q_, k_, v_ = (x.detach().requires_grad_() for x in (q, k, v))
        out, _ = fn(Module(), q_, k_, v_)
        out.sum().backward()
    once()  # warm-up: the masks, the kernel's buffers
    start = time.perf_counter()
    for _ in range(steps):
        once()
    return (time.perf_counter() - start) / steps * 1000


def plain(module, q, k, v):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, q, k, v, None, is_causal=True)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="forward+backward calls timed per round")
    ap.add_argument("--quick", action="store_true", help="two shapes, one round (CI)")
    args = ap.parse_args()
    shapes, repeats, steps = (QUICK, 1, 2) if args.quick else (SHAPES, args.repeats, args.steps)
    rows = []
    for d, heads, batch, length in shapes:
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, heads, length, d) for _ in range(3))
        got: dict[str, list[float]] = {"sdpa": [], "forge": []}
        for r in range(repeats):  # alternating, the order turning each round
            for name in (["sdpa", "forge"] if r % 2 == 0 else ["forge", "sdpa"]):
                got[name].append(fwd_bwd_ms(plain if name == "sdpa" else causal_sdpa, q, k, v, steps))
        base, ours = statistics.median(got["sdpa"]), statistics.median(got["forge"])
        rows.append([f"head_dim {d}, {heads} heads, {batch} x {length}", base, ours, base / ours,
                     every_run(got["sdpa"], "{:.1f}") + " / " + every_run(got["forge"], "{:.1f}")])
    print(machine_line())
    print_table("bench_attention", ["SDPA causal, ms fwd+bwd", "forge causal_sdpa, ms", "SDPA ÷ forge (time)",
                                    "runs (SDPA / forge)"], rows)

if __name__ == "__main__":
    main()
