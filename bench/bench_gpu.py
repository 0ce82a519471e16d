"""forge's GPU fast path on one accelerator: a ~1B-parameter Llama-style model from random init,
trained by `forge run` for a few dozen steps in bf16, eager and compiled, with and without FSDP2.

    python bench/bench_gpu.py [--steps 30] [--target h200:1]     # on the GPU machine (issue 21 item 7)
    python bench/bench_gpu.py --quick                             # a 2-layer model on CPU, eager only (CI)

Each mode is one `torchrun --nproc_per_node 1 -m forge.cli run RECIPE key=value...` in its own
output folder (the same recipe; the mode is overrides: `stages.0.compile=true`,
`parallelism.strategy=fsdp`, `parallelism.mixed_precision=bf16`). From each run's saved stage result
it prints tokens/s, MFU (forge's per-window figure, FLOPs from the planner, peak from the hardware
catalog), peak accelerator memory, and the step time `forge plan RECIPE --target TARGET` predicted,
side by side with the ratios to eager without FSDP. Targets (issue 21): MFU >= 45% compiled, the
prediction within 10% of the measured step time. The first steps (compilation, allocator warm-up)
count in the stage's mean; the per-window MFU in MLflow shows the steady state.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192) with a 32K vocab:
# about 1.1B parameters
BIG = {"hidden_size": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "intermediate_size": 8192,
       "vocab_size": 32000, "max_position": 2048}
# GPT-2-small-like (~110M with the 32K vocab): short steps, where per-step host syncs show
SMALL = {"hidden_size": 768, "layers": 12, "heads": 12, "kv_heads": 4, "intermediate_size": 2048,
         "vocab_size": 32000, "max_position": 1024}
TINY = {"hidden_size": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vocab_size": 512, "max_position": 256}

MODES = {  # name -> overrides
    "eager": [],
    "compiled": ["stages.0.compile=true"],
    "eager+fsdp2": ["parallelism.strategy=fsdp", "parallelism.mixed_precision=bf16"],
    "compiled+fsdp2": ["stages.0.compile=true", "parallelism.strategy=fsdp", "parallelism.mixed_precision=bf16"],
}


def recipe(out: Path, quick: bool, steps: int, size: str = "big") -> dict:
    model, seq, batch = (TINY, 128, 4) if quick else (SMALL, 1024, 8) if size == "small" else (BIG, 2048, 8)
    return {
        "name": "gpu-bench",
        "base": {"scratch": {**model, "tokenizer_sources": ["general"]}},
        "data": {"general": {"generate": {"kind": "stories", "documents": 2000 if quick else 40000, "seed": 0}}},
        "stages": [{"name": "cpt", "kind": "pretrain", "mixture": {"general": 1.0}, "max_steps": steps,
                    "seq_len": seq, "batch_size": batch, "precision": "fp32" if quick else "bf16",
                    "optim": {"lr": 3e-4}, "schedule": {"kind": "constant"}, "log_every": max(1, steps // 6),
                    "max_repeats": 1000, "eval": {"max_blocks": 2},
                    "checkpoint": {"every": 0, "final_optimizer": False}}],
        "tracking": {"register_model": False},
        "output": str(out),
    }


def run_mode(path: Path, out: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "forge.cli", "run",
           str(path), f"output={out}", *overrides]
    env = {**os.environ, "PYTHONPATH": os.environ.get("FORGE_SRC", str(REPO))}  # FORGE_SRC: another checkout's forge
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:  # forge's own error line, not torchrun's footer
        lines = (done.stdout + done.stderr).strip().splitlines()
        said = [ln for ln in lines if ln.startswith(("forge:", "Traceback")) or "Error" in ln][-3:]
        return {"error": " / ".join(said or lines[-5:])}
    state = json.loads((out / "stages" / "cpt" / "final" / "forge_state.json").read_text())
    return state["result"]["metrics"]


def predicted_step_s(path: Path, target: str) -> float | None:
    done = subprocess.run([sys.executable, "-m", "forge.cli", "plan", str(path), "--target", target, "--json"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    try:
        plans = json.loads(done.stdout)
    except json.JSONDecodeError:
        return None
    rows = plans if isinstance(plans, list) else plans.get("plans", [])
    times = [p.get("step_time_s") for p in rows if isinstance(p, dict) and p.get("step_time_s")]
    return float(times[0]) if times else None


def table(results: dict[str, dict], predicted: float | None) -> str:
    base = results.get("eager", {})
    head = f"{'mode':<16}{'tok/s':>12}{'x eager':>9}{'MFU':>8}{'peak GB':>9}{'step s':>9}{'plan s':>9}{'plan/meas':>10}"
    lines = [head, "-" * len(head)]
    for name, m in results.items():
        if "error" in m:
            lines.append(f"{name:<16}failed: {m['error'][:200]}")
            continue
        tps, step = m["tokens_per_s_mean"], m["step_time_s"]
        ratio = tps / base["tokens_per_s_mean"] if base.get("tokens_per_s_mean") else float("nan")
        mfu = f"{m['mfu_mean']:.1%}" if "mfu_mean" in m else "-"
        plan = f"{predicted:.3f}" if predicted else "-"
        vs = f"{predicted / step:.2f}" if predicted else "-"
        lines.append(f"{name:<16}{tps:>12,.0f}{ratio:>9.2f}{mfu:>8}{m['peak_mem_bytes'] / 1e9:>9.1f}"
                     f"{step:>9.3f}{plan:>9}{vs:>10}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--target", default="h200:1", help="what `forge plan --target` predicts for")
    ap.add_argument("--quick", action="store_true", help="a 2-layer model on CPU, eager only (the script's own check)")
    ap.add_argument("--modes", default=None, help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--size", choices=("big", "small"), default="big", help="big: ~1.1B; small: ~110M")
    ap.add_argument("--logs", type=Path, default=None, help="copy each mode's full output here")
    args = ap.parse_args()
    steps = 4 if args.quick else args.steps
    modes = args.modes.split(",") if args.modes else (["eager"] if args.quick else list(MODES))
    root = Path(tempfile.mkdtemp(prefix="forge-bench-gpu-"))
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(root / "out", args.quick, steps, args.size), sort_keys=False))
    # fp32 on CPU: no bf16 compute for FSDP2 either
    overrides = {m: [o for o in MODES[m] if not (args.quick and o.endswith("mixed_precision=bf16"))] for m in modes}
    try:
        results = {m: run_mode(path, root / m, overrides[m]) for m in modes}
        predicted = None if args.quick else predicted_step_s(path, args.target)
    finally:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in root.glob("*.log"):
                shutil.copy(log, args.logs / log.name)
        shutil.rmtree(root, ignore_errors=True)
    shape = "~110M" if args.size == "small" else "~1.1B"
    print(f"{'quick: 2-layer model, CPU' if args.quick else f'{shape} Llama-style, bf16, {steps} steps'}; "
          f"prediction: forge plan --target {args.target}")
    print(table(results, predicted))
    if any("error" in m for m in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
