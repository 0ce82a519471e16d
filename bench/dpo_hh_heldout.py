"""Held-out DPO figures on real data: stories260K trained with the DPO stage on HH-RLHF harmless
pairs from ../shared/data, printing held-out reward margin, accuracy and loss every `every` steps.

    python bench/dpo_hh_heldout.py n=2312 hold=0.3 seq=256 bs=32 steps=16 every=4 lr=5e-5 [beta=0.1] [seed=0]

`n`: how many of the 2,312 records to read; `hold`: the held-out share. Not a speed benchmark:
the numbers behind recipes/hh_dpo.yaml and tests/stages/test_dpo.py's real-data test.
"""
from __future__ import annotations

import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from forge.inputs import resolve_source  # noqa: E402
from forge.recipe import DataSource, DpoStage  # noqa: E402
from forge_testing import run_stage, shared_path  # noqa: E402


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    n, hold = int(args.get("n", 2312)), float(args.get("hold", 0.3))
    tmp = Path(tempfile.mkdtemp(prefix="dpo-hh-"))
    lines = gzip.open(shared_path("preference", "hh_rlhf_harmless", "test.jsonl.gz"), "rt").readlines()[:n]
    (tmp / "hh.jsonl").write_text("".join(lines))
    src = resolve_source("hh", DataSource(path=str(tmp / "hh.jsonl"), holdout=hold, chat={"kind": "hh"},
                                          on_error="skip"), tmp)
    stage = DpoStage(name="dpo", kind="dpo", data=["hh"], max_steps=int(args.get("steps", 16)),
                     seq_len=int(args.get("seq", 256)), batch_size=int(args.get("bs", 32)),
                     beta=float(args.get("beta", 0.1)), loss=args.get("loss", "sigmoid"),
                     optim={"lr": float(args.get("lr", 5e-5))}, schedule={"kind": args.get("sched", "constant")},
                     seed=int(args.get("seed", 0)), eval={"max_blocks": 1000, "every": int(args.get("every", 0))})
    rows = []

    class Rows:
        def log_metrics(self, m, step=None):
            if "eval_rewards/margin" in m:
                rows.append((step, m["eval_rewards/margin"], m["eval_rewards/accuracy"], m["eval_loss"]))

        def __getattr__(self, name):
            return lambda *a, **k: None

    start = time.time()
    m = run_stage(stage, shared_path("models", "stories260K"), {"hh": src}, tmp / "out", tracker=Rows()).metrics
    print(json.dumps(args), f"train pairs {m['train_pairs']}, held-out pairs {m['heldout_pairs']}, "
          f"epochs {m['epochs']:.2f}, {time.time() - start:.0f} s")
    print(f"{'step':>5} {'margin':>8} {'accuracy':>9} {'loss':>7}")
    for step, margin, acc, loss in rows:
        print(f"{step:>5} {margin:>8.4f} {acc:>9.3f} {loss:>7.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
