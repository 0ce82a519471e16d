"""How OpenMP's waiting threads cost a CPU training step: libgomp's default (spin 300,000 rounds),
never spinning (OMP_WAIT_POLICY=PASSIVE) and forge's setting (GOMP_SPINCOUNT=3000, forge/cli.py),
on idle cores and with a busy loop holding one core (a shared machine, tests beside a run).

    python bench/bench_omp.py [--steps 30] [--repeats 3] [--quick]

Each setting runs in a fresh process (libgomp reads the variables once, when torch loads), which
times the step on idle cores, then starts the busy loop and times it again (one process a setting:
loading torch and transformers costs more than the steps): a training step (forward, backward,
AdamW) of a Llama shaped like forge-tiny (hidden 128, 4 layers, 4 heads, 2 KV heads, vocab 4096)
at batch 4 x 256, random weights and tokens; the median of `--repeats` rounds, the settings' order
rotating. `--quick` (CI): hidden 32, 2 layers, batch 2 x 64, 3 steps, one round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

SETTINGS = {"libgomp default (spin 300,000)": {},
            "OMP_WAIT_POLICY=PASSIVE (never spin)": {"OMP_WAIT_POLICY": "PASSIVE"},
            "GOMP_SPINCOUNT=3000 (forge)": {"GOMP_SPINCOUNT": "3000"}}
FORGE = "GOMP_SPINCOUNT=3000 (forge)"


def child(shape: dict) -> None:
    """One setting's measurements, in this fresh process: ms a step on idle cores, then with a busy
    loop holding one core, printed as JSON."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=shape["hidden"], intermediate_size=4 * shape["hidden"],
                                         num_hidden_layers=shape["layers"], num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=4096, max_position_embeddings=512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 4096, (shape["batch"], shape["seq_len"]))

    def step() -> None:
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed() -> float:
        for _ in range(2):  # warm-up, and the busy loop settled on its core
            step()
        start = time.perf_counter()
        for _ in range(shape["steps"]):
            step()
        return (time.perf_counter() - start) / shape["steps"] * 1000

    idle = timed()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = timed()
    finally:
        hog.kill()
        hog.wait()
    print(json.dumps({"idle": idle, "busy": busy}))


def measure(extra: dict, shape: dict) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(shape)], env={**env, **extra},
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return {k: float(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a 2-layer hidden-32 model, 3 steps, one round (CI)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    shape = {"hidden": 128, "layers": 4, "batch": 4, "seq_len": 256, "steps": args.steps}
    if args.quick:
        shape.update(hidden=32, layers=2, batch=2, seq_len=64, steps=3)
        args.repeats = 1
    from benchlib import machine_line, print_table, runs

    rows = []
    names = list(SETTINGS)
    got = {cond: {n: [] for n in names} for cond in ("idle", "busy")}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for cond, ms in measure(SETTINGS[name], shape).items():
                got[cond][name].append(ms)
    for cond, where in (("idle", "idle"), ("busy", "a busy loop on one core")):
        ours = statistics.median(got[cond][FORGE])
        print(f"{where}: " + ", ".join(f"{n} {statistics.median(v):.1f} ms" for n, v in got[cond].items()))
        rows += [[f"{name}, {where}", statistics.median(v), statistics.median(v) / ours, runs(v, "{:.1f}")]
                 for name, v in got[cond].items()]
    print(f"training step: hidden {shape['hidden']}, {shape['layers']} layers, batch {shape['batch']} x "
          f"{shape['seq_len']}, {shape['steps']} steps, median of {args.repeats}")
    print(machine_line())
    print_table("bench_omp", ["ms a step", "÷ forge's setting", "runs (ms)"], rows)


if __name__ == "__main__":
    main()
