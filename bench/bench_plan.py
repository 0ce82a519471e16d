"""Side-by-side system ratios from the hardware catalog, and one stage planned across targets.

    python bench/bench_plan.py [preset-or-config] [tokens]   # default: llama-3.1-8b, 100B tokens at 8K

Prints the headline ratios (Trn3 UltraServer vs Trn2 UltraServer: FP8 compute, HBM capacity and
bandwidth) and continued pretraining on a Trn3 UltraServer, a Trn2 UltraServer and 64 H100/H200/B200.
"""
from __future__ import annotations

import sys
import time

from forge.plan import workloads as W
from forge.plan.command import parse_count
from forge.plan.hardware import get_system, system_totals
from forge.plan.model import load_model_config
from forge.plan.planner import compare
from forge.plan.report import format_table


def headline_ratios() -> dict:
    trn3 = system_totals(get_system("trn3-ultraserver"), precision="fp8")
    trn2 = system_totals(get_system("trn2-ultraserver"), precision="fp8")
    return {k: trn3[k] / trn2[k] for k in ("peak_pflops", "hbm_tb", "hbm_tbps")}


def main(argv: list[str]) -> None:
    model = argv[0] if argv else "llama-3.1-8b"
    tokens = parse_count(argv[1]) if len(argv) > 1 else 100e9
    r = headline_ratios()
    print(f"Trn3 UltraServer / Trn2 UltraServer: FP8 compute {r['peak_pflops']:.2f}x, "
          f"HBM capacity {r['hbm_tb']:.2f}x, HBM bandwidth {r['hbm_tbps']:.2f}x")
    seq = 8192
    wl = W.pretrain("cpt", seq, max(1, 4 * 2**20 // seq), tokens=tokens)
    t0 = time.perf_counter()
    plans = compare(load_model_config(model), wl, [("trn3-ultraserver", None), ("trn2-ultraserver", None),
                                                   ("h100", 64), ("h200", 64), ("b200", 64)])
    elapsed = time.perf_counter() - t0
    print(format_table(plans), end="")
    base = next(p for p in plans if p.target == "trn2-ultraserver")
    for p in plans:
        if p.feasible and base.feasible:
            print(f"{p.target:<20} time {p.hours / base.hours:5.2f}x  cost {p.cost_usd / base.cost_usd:5.2f}x  "
                  f"energy {p.energy_kwh / base.energy_kwh:5.2f}x  (vs trn2-ultraserver)")
    print(f"planned 5 targets in {elapsed:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
