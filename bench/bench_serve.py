"""forge serve's overhead: a supervised LoRA loop driven through the Tinker API (the official SDK
against `forge serve` in its own process on 127.0.0.1: forward_backward + optim_step per step)
against the same steps under forge's own SFT step in-process (open_session + train_step +
masked_lm_loss, the same base, adapters, seed, AdamW settings and token batches), the two loops
taking turns step by step so that both meet the same load on a shared machine; real (non-pad)
tokens per second of each loop's own steps, the median of `--repeats` rounds (the one leading
alternating), and the ratio. Then the latency of a small forward_backward round trip (one datum of
8 tokens, `.result()` included): the median of 20 after warm-up.

    python bench/bench_serve.py [--steps 20] [--batch 8] [--seq-len 256] [--repeats 3] [--quick]

Both loops take one forward and one backward pass per datum (forward_backward takes its backward
pass at once; optim_step is forge.train.step.apply_update), so the ratio is the cost of the HTTP
path and the SDK. `--quick` (CI): 3 steps of batch 2 at seq_len 64, one round.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
# the OpenMP wait policy the `forge` command sets before torch loads (forge/cli.py): forge serve runs
# under it, so forge's in-process step must too (on a loaded CPU, spinning threads stall it 4x)
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")

from benchlib import REPO, machine_line, print_table, quiet_libraries, runs as every_run, scratch_base  # noqa: E402

KEY = "tml-forge-bench-serve-key-000000000000"
RANK, ALPHA, SEED, LR = 16, 32.0, 0, 1e-3


def token_rows(src, tok, n: int, seq_len: int) -> list[list[int]]:
    """`n` rows of `seq_len` tokens of the generated stories, one document after another."""
    import json

    ids: list[int] = []
    for line in Path(src.files[0]).read_text().splitlines():
        ids += tok(json.loads(line)["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        if len(ids) >= n * seq_len:
            break
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(n)]


def start_server(base: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    import socket

    import httpx
    import yaml

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    cfg = tmp / "serve.yaml"
    cfg.write_text(yaml.safe_dump({"models": [{"name": "bench", "base": str(base)}], "api_keys": [KEY],
                                   "lora_alpha": ALPHA, "workdir": str(tmp / "serve")}))
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "serve", "--config", str(cfg), "--port", str(port),
                             "--log-level", "warning"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("forge serve did not start")


class ApiLoop:
    """The supervised loop through the SDK: one training client, a step = forward_backward + optim_step."""

    def __init__(self, url: str, rows: list[list[int]], batch: int):
        import tinker
        from tinker import types

        self.types, self.rows, self.batch = types, rows, batch
        self.scale = 1.0 / sum(len(r) - 1 for r in rows[:batch])  # Tinker's sum with these weights: forge's mean
        self.sc = tinker.ServiceClient(base_url=url, api_key=KEY)
        self.tc = self.sc.create_lora_training_client(base_model="bench", rank=RANK, seed=SEED).result()
        self.adam = types.AdamParams(learning_rate=LR, beta1=0.9, beta2=0.95, eps=1e-8)

    def step(self, k: int) -> None:
        types = self.types
        data = [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                            loss_fn_inputs={"target_tokens": r[1:], "weights": [self.scale] * (len(r) - 1)})
                for r in self.rows[k * self.batch:(k + 1) * self.batch]]
        fwd = self.tc.forward_backward(data, "cross_entropy")
        self.tc.optim_step(self.adam).result()
        fwd.result()

    def close(self) -> None:
        self.sc.close("success").result()


class ForgeLoop:
    """The same steps under forge's SFT step in-process: train_step over masked_lm_loss, on a session
    with the same base, adapters, seed and AdamW settings."""

    def __init__(self, base: Path, rows: list[list[int]], batch: int, out: Path):
        from forge.serve.trainer import Adapters, Place, Settings, targets
        from forge.serve.wire import LoraRequest
        from forge.train.session import open_session
        from forge.train.step import DivergenceGuard

        settings = Settings(name="bench", precision="fp32", seed=SEED)
        settings.optim.lr, settings.optim.betas, settings.optim.eps = LR, (0.9, 0.95), 1e-8
        adapters = Adapters(RANK, ALPHA, targets(LoraRequest(rank=RANK)))
        self.session = open_session(settings, Place(base, out), lora=adapters)
        self.guard, self.rows, self.batch = DivergenceGuard(settings.guard, "bench"), rows, batch

    def step(self, k: int) -> None:
        import torch

        from forge.train.losses import masked_lm_loss
        from forge.train.step import train_step

        ids = torch.tensor(self.rows[k * self.batch:(k + 1) * self.batch])
        batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
        train_step(self.session, [batch], masked_lm_loss, self.guard, k).loss.item()  # the API loop reads its loss too

    def close(self) -> None:
        pass


def one_round(loops: dict, steps: int, first: str) -> dict[str, float]:
    """Seconds of `steps` steps of each loop after one warm-up step, the loops taking turns step by
    step (`first` leads), so that both meet the same load on a shared machine."""
    order = [first, *(n for n in loops if n != first)]
    spent = dict.fromkeys(loops, 0.0)
    for k in range(steps + 1):
        for name in order:
            start = time.perf_counter()
            loops[name].step(k)
            if k:
                spent[name] += time.perf_counter() - start
    return spent


def round_trip_ms(url: str, calls: int = 20) -> float:
    import tinker
    from tinker import types

    sc = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:
        tc = sc.create_lora_training_client(base_model="bench", rank=RANK, seed=SEED).result()
        d = types.Datum(model_input=types.ModelInput.from_ints(list(range(3, 11))),
                        loss_fn_inputs={"target_tokens": list(range(4, 12))})
        times = []
        for _ in range(calls + 3):
            start = time.perf_counter()
            tc.forward_backward([d], "cross_entropy").result()
            times.append(time.perf_counter() - start)
        tc.optim_step(types.AdamParams(learning_rate=LR)).result()
        return 1000 * statistics.median(times[3:])
    finally:
        sc.close("success").result()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="3 steps of batch 2 at seq_len 64, one round (CI)")
    args = ap.parse_args()
    if args.quick:
        args.__dict__.update(steps=3, batch=2, seq_len=64, hidden=64, layers=2, repeats=1)
    quiet_libraries()
    from transformers import AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-serve-"))
    base, src = scratch_base(tmp, args.hidden, args.layers, args.seq_len, documents=300 if args.quick else 2000)
    rows = token_rows(src, AutoTokenizer.from_pretrained(base), (args.steps + 1) * args.batch, args.seq_len)
    tokens = args.steps * args.batch * args.seq_len  # every position is a real token (no padding)
    proc, url = start_server(base, tmp)
    try:
        api_s, forge_s = [], []
        for r in range(args.repeats):
            loops = {"api": ApiLoop(url, rows, args.batch), "forge": ForgeLoop(base, rows, args.batch, tmp / f"forge{r}")}
            try:
                spent = one_round(loops, args.steps, "api" if r % 2 == 0 else "forge")
            finally:
                for loop in loops.values():
                    loop.close()
            api_s.append(spent["api"])
            forge_s.append(spent["forge"])
        latency = round_trip_ms(url)
    finally:
        proc.terminate()
        proc.wait(60)
    api_rate = [tokens / s for s in api_s]
    forge_rate = [tokens / s for s in forge_s]
    print(machine_line())
    print(f"model: scratch Llama {args.layers} x {args.hidden}, LoRA rank {RANK} (attention, MLP, head), "
          f"{args.steps} steps of {args.batch} x {args.seq_len} tokens, median of {args.repeats}")
    ratio = statistics.median(api_rate) / statistics.median(forge_rate)
    print_table("bench_serve", ["supervised LoRA loop, tokens/s", "vs forge's SFT step", "every round (tokens/s)"], [
        ("forge's SFT step (in-process)", statistics.median(forge_rate), 1.0, every_run(forge_rate, "{:,.0f}")),
        ("Tinker API (SDK -> forge serve)", statistics.median(api_rate), ratio, every_run(api_rate, "{:,.0f}"))])
    print(f"small forward_backward round trip (1 datum, 8 tokens, SDK .result()): {latency:.1f} ms (median of 20)")


if __name__ == "__main__":
    main()
