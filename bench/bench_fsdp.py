"""FSDP2 vs DDP on two CPU processes (gloo), side by side: the same pretraining stage, the same global
batch, `parallelism: {strategy: fsdp}` against `{strategy: ddp}`, each in its own torchrun launch
(fresh processes, so neither pays the other's warm-up or inherits its memory), the two in turn and
the order alternating each round, so a noisy spell hits both alike.

    python bench/bench_fsdp.py [--steps 20] [--repeats 3] [--hidden 256] [--layers 4] [--quick]

Each rank runs the stage through forge's runner (as `forge run` does) and writes its figures; printed:
training tokens/s of all ranks (median of the rounds) and FSDP ÷ DDP, and each rank's peak memory:
during the stage (on CPU the growth of its peak RSS over the stage, forge.train.memory) and the whole
process's peak RSS (libraries included), FSDP ÷ DDP.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from benchlib import REPO, machine_line, median, print_table, runs  # noqa: E402

STRATEGIES = ("ddp", "fsdp")


def stage(cfg: dict):
    from forge.recipe import PretrainStage

    return PretrainStage(name=f"cpt-{cfg['strategy']}-{cfg['round']}", kind="pretrain", mixture={"general": 1.0},
                         max_steps=cfg["steps"], seq_len=cfg["seq_len"], batch_size=cfg["batch"], optim={"lr": 1e-3},
                         schedule={"kind": "constant"}, eval={"max_blocks": 1}, log_every=cfg["steps"],
                         checkpoint={"final_optimizer": False})


def rank_main(config: str) -> None:
    """One rank of a launch: the stage at the launch's strategy, its figures to OUT/<rank>-<strategy>-<round>.json."""
    from forge.inputs import resolve_source
    from forge.kinds import KINDS
    from forge.recipe import DataSource, GeneratedText, Parallelism
    from forge.stages.result import StageInputs
    from forge.track import null_tracker
    from forge.train.memory import peak_rss_mb

    cfg, rank = json.loads(config), int(os.environ.get("RANK", "0"))
    out = Path(cfg["out"])
    src = resolve_source("general", DataSource(generate=GeneratedText(kind="stories", documents=cfg["documents"])),
                         Path(cfg["data"]))
    s = stage(cfg)
    inputs = StageInputs(Path(cfg["base"]), {"general": src}, out / s.name, null_tracker(), log=lambda *_: None,
                         parallelism=Parallelism(strategy=cfg["strategy"]))
    m = KINDS["pretrain"].runner()(s, inputs).metrics
    (out / f"{rank}-{cfg['strategy']}-{cfg['round']}.json").write_text(json.dumps(
        {**{k: m[k] for k in ("tokens", "train_seconds", "peak_mem_bytes")}, "process_peak_bytes": peak_rss_mb() * 2**20}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(cfg: dict) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(Path(__file__).resolve()), "--rank-worker", json.dumps(cfg)]
    done = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800)
    if done.returncode != 0:
        at = done.stdout.find("Traceback")
        shown = done.stdout[at:at + 4000] if at >= 0 else done.stdout[-4000:]
        sys.exit(f"the torchrun launch failed ({done.returncode}):\n{shown}")


def table(out: Path, repeats: int) -> list[list]:
    def fig(rank: int, strategy: str, key: str) -> list[float]:
        return [json.loads((out / f"{rank}-{strategy}-{r}.json").read_text())[key] for r in range(repeats)]

    tps = {s: [t / sec for t, sec in zip(fig(0, s, "tokens"), fig(0, s, "train_seconds"))] for s in STRATEGIES}
    rows = [[f"{s}: tokens/s (2 ranks)", median(tps[s]), median(tps[s]) / median(tps["ddp"]), runs(tps[s], "{:,.0f}")]
            for s in STRATEGIES]
    for rank in (0, 1):
        mem = {s: [b / 2**20 for b in fig(rank, s, "peak_mem_bytes")] for s in STRATEGIES}
        rows += [[f"{s}: rank {rank}'s peak memory during the stage, MiB", median(mem[s]),
                  median(mem[s]) / median(mem["ddp"]), runs(mem[s], "{:.0f}")] for s in STRATEGIES]
    for rank in (0, 1):
        mem = {s: [b / 2**20 for b in fig(rank, s, "process_peak_bytes")] for s in STRATEGIES}
        rows += [[f"{s}: rank {rank}'s process peak RSS, MiB", median(mem[s]), median(mem[s]) / median(mem["ddp"]),
                  runs(mem[s], "{:.0f}")] for s in STRATEGIES]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4, help="blocks per rank and step")
    ap.add_argument("--quick", action="store_true", help="a 2-layer hidden-64 model, 3 steps, one round (CI)")
    ap.add_argument("--rank-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        return rank_main(args.rank_worker)
    if args.quick:
        args.__dict__.update(steps=3, repeats=1, hidden=64, layers=2, seq_len=64, batch=2)
    from benchlib import quiet_libraries, scratch_base

    quiet_libraries()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-fsdp-"))
    documents = 300 if args.quick else 2000
    base, _ = scratch_base(tmp, args.hidden, args.layers, args.seq_len, documents)
    cfg = {"base": str(base), "data": str(tmp), "out": str(tmp / "out"), "documents": documents, "steps": args.steps,
           "seq_len": args.seq_len, "batch": args.batch}
    Path(cfg["out"]).mkdir()
    for r in range(args.repeats):
        for strategy in (STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]):
            launch({**cfg, "strategy": strategy, "round": r})
    print(machine_line())
    print(f"model: scratch llama {args.layers} layers, hidden {args.hidden}; {args.steps} steps x 2 ranks x {args.batch} "
          f"x {args.seq_len} tokens; torchrun --nproc-per-node 2, gloo, OMP_NUM_THREADS=1; median of {args.repeats}")
    print_table("bench_fsdp", ["figure", "÷ ddp", "runs"], table(Path(cfg["out"]), args.repeats))


if __name__ == "__main__":
    main()
