"""The planner's predicted step time on this machine vs the step time the same stage measures, side
by side: a recipe of pretraining stages (the bench_pretrain model at two shapes) planned with
`forge plan RECIPE --target local --json`, then each stage trained by forge's runner (as `forge run`
trains it) and its mean step time (training time only) compared with three predictions:

  guess       `--no-measure`: the hardware catalog's uncalibrated rate for a CPU
  measured    the default: a few timed steps of the stage's model at its micro-batch shape (forge.plan.measure)
  calibrated  `--calibration` from `forge plan --calibrate --runs` over the previous round's recorded runs
              (from the second round on: fitted on other runs than the one it predicts)

    python bench/bench_predict.py [--repeats 3] [--steps 20] [--quick]

Printed: each prediction, the measured step time and predicted ÷ measured (median over rounds).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from benchlib import machine_line, median, print_table, quiet_libraries, runs, scratch_base  # noqa: E402

BASES = ("guess", "measured", "calibrated")


def forge_cli(*argv: str) -> str:
    """What `forge ARGV` prints on stdout (run in this process: no second interpreter to start)."""
    from forge.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    if code not in (0, 1):  # 1: a stage does not fit (the table says so); still a plan
        sys.exit(f"forge {' '.join(argv)} exited {code}")
    return out.getvalue()


def planned(recipe: Path, *flags: str) -> dict[str, float]:
    """Stage name -> predicted step seconds on the local target."""
    return {p["stage"]: p["step_time_s"] for p in json.loads(forge_cli("plan", str(recipe), "--target", "local",
                                                                        "--json", *flags))}


def write_recipe(path: Path, base: Path, documents: int, shapes: list[tuple[int, int]], steps: int, out: Path) -> Path:
    stages = [{"name": f"cpt-s{seq}-b{batch}", "kind": "pretrain", "mixture": {"general": 1.0}, "max_steps": steps,
               "seq_len": seq, "batch_size": batch, "optim": {"lr": 1e-3}, "schedule": {"kind": "constant"},
               "eval": {"max_blocks": 1}, "log_every": steps, "checkpoint": {"final_optimizer": False}}
              for seq, batch in shapes]
    recipe = {"name": "bench-predict", "base": str(base),
              "data": {"general": {"generate": {"kind": "stories", "documents": documents}}},
              "stages": stages, "output": str(out)}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def train(recipe_path: Path, base: Path, sources: dict, out: Path) -> dict[str, float]:
    """Each stage trained from the base; its measured step time, recorded for calibration as `forge run` does."""
    from forge.kinds import KINDS
    from forge.plan.record import log_measured
    from forge.recipe import load_recipe
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    recipe, config = load_recipe(recipe_path), json.loads((base / "config.json").read_text())
    got = {}
    for stage in recipe.stages:
        result = KINDS[stage.kind].runner()(stage, StageInputs(base, sources, out / stage.name, null_tracker(),
                                                               log=lambda *_: None))
        log_measured(null_tracker(), config, stage, result.steps, result.metrics, out / stage.name)
        got[stage.name] = result.metrics["step_time_s"]
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="a 2-layer hidden-64 model, one shape, 4 steps, one round (CI)")
    args = ap.parse_args()
    shapes = [(256, 8), (128, 4)]
    if args.quick:
        args.__dict__.update(repeats=1, steps=4, hidden=64, layers=2)
        shapes = [(64, 4)]
    quiet_libraries()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-predict-"))
    documents = 300 if args.quick else 2000
    base, src = scratch_base(tmp, args.hidden, args.layers, max(s for s, _ in shapes), documents)
    got: dict[str, dict[str, list[float]]] = {}
    for r in range(args.repeats):
        out = tmp / f"round-{r}"
        recipe = write_recipe(tmp / f"r{r}.yaml", base, documents, shapes, args.steps, out)
        predicted = {"guess": planned(recipe, "--no-measure"), "measured": planned(recipe)}
        if r:  # fitted on the previous round's runs, not on the one it predicts
            cal = tmp / f"calibration-{r}.yaml"
            forge_cli("plan", "--calibrate", "--runs", str(tmp / f"round-{r - 1}"))
            (tmp / f"round-{r - 1}" / "calibration.yaml").replace(cal)
            predicted["calibrated"] = planned(recipe, "--calibration", str(cal))
        for name, seconds in train(recipe, base, {"general": src}, out).items():
            row = got.setdefault(name, {"measured step": []})
            row["measured step"].append(seconds)
            for basis, plans in predicted.items():
                row.setdefault(basis, []).append(plans[name] / seconds)
    print(machine_line())
    print(f"model: scratch llama {args.layers} layers, hidden {args.hidden}; pretraining stages of {args.steps} steps; "
          f"median of {args.repeats} (calibrated: of {max(args.repeats - 1, 0)}, each fitted on the round before)")
    rows = []
    for name, row in got.items():
        rows.append([f"{name}: measured step time, s", median(row["measured step"]), "", runs(row["measured step"], "{:.3f}")])
        rows += [[f"{name}: predicted ({basis}) ÷ measured", "", median(row[basis]), runs(row[basis], "{:.2f}")]
                 for basis in BASES if row.get(basis)]
    print_table("bench_predict", ["seconds", "predicted ÷ measured", "runs"], rows)


if __name__ == "__main__":
    main()
