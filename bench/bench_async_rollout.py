"""Synchronous vs asynchronous RFT rollouts, side by side: the wall-clock of the same GRPO stage with
`rollout: {mode: on_policy}` and with `{mode: off_policy_async, max_age: K}` (the next rollout made in a
background thread on a copy of the weights while the current step trains), alternating, best of each.

    python bench/bench_async_rollout.py [--base .forge/foundations/forge-tiny/post-trained] [--steps 8]
        [--repeats 2] [--max-age 1] [--threads N] [--quick]

The stage: prompts "Tell me about thing i.", batch 4 x group 4, 32 new tokens, the e_share reward of
tests/stages/rft_rewards.py, one update per rollout. Printed: the loop's seconds per stage (rollouts
taken plus optimizer steps; loading, evaluation and saving left out), the ratio, the completion length,
and the side-by-side table (bench/benchlib.py). Without the forge-tiny foundation (or with `--quick`:
2 steps of 2 prompts x 2, 8 new tokens, one round, no warm-up run, CI) the base is a scratch 2-layer hidden-64 Llama.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

from benchlib import machine_line, print_table, quiet_libraries, scratch_base  # noqa: E402


def stage(steps: int, rollout: dict, quick: bool = False):
    from forge.recipe import RftStage

    return RftStage(name="rft", kind="rft", data=["p"], rewards=[{"source": f"{ROOT}/tests/stages/rft_rewards.py:e_share"}],
                    max_steps=steps, seq_len=128, batch_size=2 if quick else 4, group=2 if quick else 4,
                    max_new_tokens=8 if quick else 32, optim={"lr": 1e-3}, log_every=1, rollout=rollout)


def run(base: Path, steps: int, rollout: dict, tmp: Path, quick: bool = False) -> tuple[float, dict]:
    from forge.inputs import resolve_source
    from forge.recipe import DataSource
    from forge_testing import run_stage

    path = tmp / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(64)))
    sources = {"p": resolve_source("p", DataSource(path=str(path), holdout=0.0), tmp)}
    import forge.stages.rft as rft
    import forge.train.loop as loop

    spent = [0.0]
    make, step = rft.Rollouts._make, loop.train_step

    def timed(fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
        return inner

    rft.Rollouts._make, loop.train_step = timed(make), timed(step)  # the loop: rollouts taken + steps
    try:
        result = run_stage(stage(steps, rollout, quick), base, sources, tmp / f"o{time.monotonic_ns()}")
    finally:
        rft.Rollouts._make, loop.train_step = make, step
    return spent[0], result.metrics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default=str(ROOT / ".forge/foundations/forge-tiny/post-trained"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-age", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="2 steps of 2 prompts x 2, 8 new tokens, one round (CI)")
    a = ap.parse_args()
    if a.quick:
        a.__dict__.update(steps=2, repeats=1)
    import torch

    quiet_libraries()
    if a.threads:
        torch.set_num_threads(a.threads)
    modes = {"sync": {"mode": "on_policy"}, "async": {"mode": "off_policy_async", "max_age": a.max_age}}
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(a.base)
        if a.quick or not base.is_dir():
            base, _ = scratch_base(Path(tmp), 64, 2, 128, 300)
        if not a.quick:
            run(base, 1, modes["sync"], Path(tmp))  # warm caches, imports
        for _ in range(a.repeats):
            for name, rollout in modes.items():
                seconds, metrics = run(base, a.steps, rollout, Path(tmp), a.quick)
                best[name] = min(best.get(name, seconds), seconds)
                print(f"{name:5s} {seconds:7.2f} s  (steps {metrics['train_seconds']:.2f} s, reward "
                      f"{metrics['reward_mean']:.3f}, completion length {metrics['completion_length']:.1f}, "
                      f"rollout age {metrics.get('rollout.age', 0):.2f})", flush=True)
    print(f"best of {a.repeats}: sync {best['sync']:.1f} s, async(max_age={a.max_age}) {best['async']:.1f} s, "
          f"speed-up x{best['sync'] / best['async']:.2f} ({a.steps} steps, torch threads {torch.get_num_threads()})")
    print(machine_line())
    print_table("bench_async_rollout", ["loop seconds (best)", "sync ÷ this"],
                [["sync (on_policy)", best["sync"], 1.0],
                 [f"async (off_policy_async, max_age {a.max_age})", best["async"], best["sync"] / best["async"]]])


if __name__ == "__main__":
    main()
