"""forge's pretrain stage vs a bare PyTorch loop: same model, same packed data, same steps.

    python bench/bench_pretrain.py [--steps 40] [--repeats 3] [--quick]

(a) forge: the full stage (mixing and packing on the fly, accelerate, grad clipping, LR schedule,
metrics to a real MLflow SQLite store); (b) bare: forward, backward, clip, optimizer step over blocks
packed beforehand, with denormals flushed as forge's loop flushes them on a CPU (forge/train/denormals.py).
Runs alternate a/b and the median of each is compared (the machine is noisy).
Prints tokens/s of each and forge's overhead, then the side-by-side table (bench/benchlib.py).
`--quick`: a 2-layer hidden-64 model, 4 steps, one run each, no MLflow store (CI).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from benchlib import machine_line, print_table, runs  # noqa: E402
from forge.data.mixing import build_mixture  # noqa: E402
from forge.inputs import resolve_source  # noqa: E402
from forge.recipe import DataSource, GeneratedText, PretrainStage, ScratchBase  # noqa: E402
from forge.scratch import build_scratch_base  # noqa: E402
from forge.stages import pretrain  # noqa: E402
from forge.stages.result import StageInputs  # noqa: E402
from forge.track import MlflowTracker as Tracker, null_tracker  # noqa: E402
from forge.train.denormals import flush_denormals  # noqa: E402


def bare_loop(checkpoint: Path, blocks: list[torch.Tensor], lr: float) -> float:
    """Forward, backward, clip (forge's default `optim.grad_clip: 1.0`), step; nothing else
    (denormals flushed in every thread, as forge's loop does on a CPU). Returns seconds for the loop."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with flush_denormals():
        start = time.perf_counter()
        for x in blocks:
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="a 2-layer hidden-64 model, 4 steps, one run each (CI)")
    args = ap.parse_args()
    if args.quick:
        args.__dict__.update(steps=4, repeats=1, hidden=64, layers=2, seq_len=64, batch=4)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    stories = GeneratedText(kind="stories", documents=300 if args.quick else 5000)
    src = resolve_source("general", DataSource(generate=stories), tmp)
    sources = {"general": src}
    base = build_scratch_base(ScratchBase(hidden_size=args.hidden, layers=args.layers, heads=4, vocab_size=2048,
                                          max_position=args.seq_len, tokenizer_sources=["general"]), [src], tmp / "base")
    stage = PretrainStage(name="bench", kind="pretrain", mixture={"general": 1.0}, max_steps=args.steps,
                          seq_len=args.seq_len, batch_size=args.batch, optim={"lr": 1e-3},
                          schedule={"kind": "constant"}, eval={"max_blocks": 1})
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    mix = build_mixture(sources, {"general": 1.0}, tok, args.seq_len, "eos")
    blocks = [mix.next_batch(args.batch) for _ in range(args.steps)]  # the very blocks forge trains on
    tokens = args.steps * args.batch * args.seq_len
    tracker = None if args.quick else Tracker(f"sqlite:///{tmp / 'mlflow.db'}", "bench")

    forge_s, bare_s = [], []
    for r in range(args.repeats):
        if args.quick:  # no MLflow store to create (its migrations take seconds)
            result = pretrain.run(stage, StageInputs(base, sources, tmp / f"run{r}", null_tracker()))
        else:
            with tracker.run(f"bench-{r}"):
                result = pretrain.run(stage, StageInputs(base, sources, tmp / f"run{r}", tracker))
        forge_s.append(result.metrics["train_seconds"])
        bare_s.append(bare_loop(base, blocks, 1e-3))
    f, b = tokens / statistics.median(forge_s), tokens / statistics.median(bare_s)
    params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(base).parameters())
    print(f"model: llama {args.layers} layers, hidden {args.hidden}, {params / 1e6:.2f}M params; "
          f"{args.steps} steps x {args.batch} x {args.seq_len} tokens; torch threads {torch.get_num_threads()}")
    print(f"{'':10}{'tokens/s':>12}{'median s':>10}   runs (s)")
    print(f"{'bare':10}{b:12,.0f}{statistics.median(bare_s):10.2f}   " + ", ".join(f"{x:.2f}" for x in bare_s))
    print(f"{'forge':10}{f:12,.0f}{statistics.median(forge_s):10.2f}   " + ", ".join(f"{x:.2f}" for x in forge_s))
    print(f"forge / bare throughput: {f / b:.3f}  (overhead {100 * (1 - f / b):+.1f}%)")
    print(machine_line())
    print_table("bench_pretrain", ["tokens/s", "÷ bare", "runs (s)"],
                [["bare loop (same blocks)", b, 1.0, runs(bare_s)], ["forge pretrain stage", f, f / b, runs(forge_s)]])


if __name__ == "__main__":
    main()
