"""`forge plan`: what a stage costs and whether it fits, from a recipe or from a model config.

    forge plan recipes/acme.yaml --target trn3,trn2,h100:64
    forge plan --model llama-3.1-8b --stage pretrain --tokens 100B --seq-len 8192 \
        --target trn3-ultraserver,trn2-ultraserver,h100:64 [--stack megatron]
    forge plan --model ./ckpt --tokens 2B --target trn2 --deadline 24 --budget 5000
    forge plan --model llama-3.1-70b              (parameter counts and memory per precision)
    forge plan --anchors                          (replay published runs: predicted vs published)
    forge plan --anchors --leave-one-out          (each anchor predicted from a fit that did not see it)
    forge plan --calibrate --runs RUNS_DIR        (fit the local machine; writes RUNS_DIR/calibration.yaml,
                                                   which runs and plans of a recipe writing to RUNS_DIR use)
    forge plan --model ./ckpt --tokens 1M --calibration RUNS_DIR/calibration.yaml
    forge plan --list-targets

Exit status: 0 when every planned stage fits, 1 when one does not (the table says why), 2 on bad
input (one line saying which argument and why).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from forge.errors import ForgeError
from forge.kinds import KINDS
from forge.plan import workloads as W
from forge.plan.calibrate import LOCAL_CHIP, calibrate
from forge.plan.hardware import get_system, known_targets, load_catalog, parse_targets
from forge.plan.model import load_model_config
from forge.plan.planner import Goal, Setup, compare, model_summary
from forge.plan.report import format_table, plot_plans, to_json
from forge.plan.stacks import get_stack, known_stacks
from forge.progress import say

DEFAULT_BATCH_TOKENS = 4 * 2**20     # ~4M tokens per step when --global-batch is not given
MAX_CHIP_YEARS = 1e6                 # a plan beyond this is a typo, not a plan
HOURS_PER_YEAR = 8766


def parse_count(text: str) -> float:
    """'100B' -> 1e11, '2.5M' -> 2.5e6, '1e9' -> 1e9."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([kKmMbBtT]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (use e.g. 100B, 2.5M, 1e9)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    try:
        return float(m.group(1)) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (use e.g. 100B, 2.5M, 1e9)") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="recipe YAML to plan (or use --model)")
    parser.add_argument("--target", help="target name(s), comma separated, NAME[:CHIPS] (see --list-targets)")
    parser.add_argument("--chips", type=int, help="plan at exactly this many chips")
    parser.add_argument("--deadline", type=float, metavar="HOURS", help="fewest chips that finish in time "
                        "(with --budget: the cheapest plan that finishes in time)")
    parser.add_argument("--budget", type=float, metavar="USD", help="fastest plan within this cost")
    parser.add_argument("--stack", help=f"training stack: {', '.join(known_stacks())} (default: the target's)")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.add_argument("--plot", metavar="PNG", help="write a chart of time and cost across targets")
    parser.add_argument("--mfu", type=float, help="override the chip's matmul efficiency (achieved GEMM / peak, 0-1]")
    parser.add_argument("--precision", help="override the stage precision (bf16, fp8, fp32, ...)")
    parser.add_argument("--hardware", action="append", default=[], metavar="YAML",
                        help="extra hardware catalog file(s) merged over the built-in one")
    parser.add_argument("--calibration", metavar="YAML", help="apply a local calibration written by --calibrate "
                        "(a recipe's compute.calibration, or a calibration.yaml in its output folder, applies unasked)")
    parser.add_argument("--no-measure", action="store_true", help="plan a recipe on the local target with the "
                        "catalog's guess instead of measuring this machine (a measurement is cached in the "
                        "output folder)")
    parser.add_argument("--list-targets", action="store_true", help="list known targets and exit")
    parser.add_argument("--anchors", action="store_true", help="replay published training runs (anchors.yaml)")
    parser.add_argument("--leave-one-out", action="store_true", help="with --anchors: refit the fitted figures "
                        "without each anchor and predict it from that fit (out-of-sample errors)")
    parser.add_argument("--calibrate", action="store_true", help="fit the local machine from recorded runs")
    parser.add_argument("--runs", metavar="DIR", help="a run's output folder or a workspace of runs (--calibrate)")
    g = parser.add_argument_group("planning without a recipe")
    g.add_argument("--model", help="config.json, checkpoint dir, or preset (e.g. llama-3.1-8b); "
                   "alone, prints parameter counts and memory")
    g.add_argument("--stage", default="pretrain", help="a stage kind that trains (forge.kinds): pretrain | "
                   "midtrain | sft | dpo | rft | ...")
    g.add_argument("--tokens", type=parse_count, help="tokens to train on (e.g. 100B)")
    g.add_argument("--steps", type=int, help="optimizer steps (instead of --tokens)")
    g.add_argument("--seq-len", type=int, default=4096)
    g.add_argument("--global-batch", type=int, help="sequences per step (pairs for dpo, prompts for rft)")
    g.add_argument("--unpacked", action="store_true", help="sft: pad each example to seq-len")
    g.add_argument("--mean-example-len", type=float, help="sft: mean example length in tokens")
    g.add_argument("--no-cached-reference", action="store_true", help="dpo: run the reference every step")
    g.add_argument("--prompt-len", type=int, help="rft: prompt tokens (default seq-len/4)")
    g.add_argument("--group", type=int, default=8, help="rft: completions per prompt")
    g.add_argument("--reward-model", action="store_true", help="rft: a policy-sized reward model scores")


POSITIVE = ("seq_len", "steps", "tokens", "global_batch", "chips", "mfu", "deadline", "budget", "prompt_len",
            "group", "mean_example_len")


def validate(args) -> None:
    """Refuse input no plan can come from, naming the argument (one line, exit status 2)."""
    for name in POSITIVE:
        value = getattr(args, name, None)
        if value is not None and not value > 0:    # also catches NaN
            raise ForgeError(f"--{name.replace('_', '-')} must be positive, got {value:g}")
    if getattr(args, "mfu", None) is not None and args.mfu > 1:
        raise ForgeError(f"--mfu is a fraction of peak and must be at most 1, got {args.mfu:g}")
    target = getattr(args, "target", None)
    if target is not None and not target.replace(",", "").strip():
        raise ForgeError("--target is empty; give a target name (see --list-targets)")
    prompt = getattr(args, "prompt_len", None)
    if prompt is not None and prompt >= args.seq_len:
        raise ForgeError(f"--prompt-len ({prompt}) must be shorter than --seq-len ({args.seq_len})")
    if getattr(args, "stack", None):
        get_stack(args.stack)


def _refuse_absurd(plans) -> None:
    for p in plans:
        years = p.chip_hours / HOURS_PER_YEAR
        if p.feasible and years > MAX_CHIP_YEARS:
            raise ForgeError(f"stage {p.stage!r} on {p.target} needs {years:.3g} chip-years (more than "
                             f"{MAX_CHIP_YEARS:.0e}): check --tokens / --steps / --global-batch")


def _workload(args) -> W.Workload:
    """The workload of `--stage KIND`, built by the kind's row of the kinds table."""
    kind = W.normalize_kind(args.stage)
    batch = args.global_batch or max(1, DEFAULT_BATCH_TOKENS // args.seq_len)
    return KINDS[kind].builder().from_args(kind, args, batch, args.precision or "bf16")


def _list_targets(catalog: dict) -> str:
    rows = [f"{'target':<24}{'chip':<34}{'default':>8}{'$/chip-h':>10}  {'stack':<9}price"]
    for key in known_targets(catalog):
        s = get_system(key, catalog)
        rows.append(f"{key:<24}{s.chip.name:<34}{s.default_chips:>8}{s.usd_per_chip_hour:>10.3f}  "
                    f"{s.default_stack:<9}{s.price_kind}")
    aliases = catalog.get("aliases", {})
    rows.append("aliases: " + ", ".join(f"{a}={t}" for a, t in sorted(aliases.items())))
    return "\n".join(rows)


def format_model_summary(summary: dict) -> str:
    """Exact parameter counts and memory per precision of one model."""
    n = summary
    lines = [f"{n['name']} ({n['arch']}, {n['layers']} layers, hidden {n['hidden']})",
             f"  parameters: total {n['params_total']:,}  active per token {n['params_active']:,}  "
             f"embedding {n['params_embedding']:,}" + (f"  lm_head {n['params_lm_head']:,}" if n['params_lm_head'] else ""),
             f"  {'precision':<10}{'weights GB':>12}{'training states GB':>20}  (weights stored at the precision; "
             f"training: 16-bit weights and grads + fp32 Adam, before sharding)"]
    for prec, mem in n["memory"].items():
        lines.append(f"  {prec:<10}{mem['weights_gb']:>12,.1f}{mem['training_states_gb']:>20,.1f}")
    return "\n".join(lines) + "\n"


def _calibrate(args) -> int:
    if not getattr(args, "runs", None):
        raise ForgeError("--calibrate needs --runs DIR: a run's output folder or a workspace of runs "
                         "(measurements stay with the runs that made them)")
    cal, path = calibrate(args.runs, getattr(args, "calibration", None))
    rates = ", ".join(f"{p}: {r:.4g} TFLOP/s + {cal.step_overhead_s[p]:.3g} s/step"
                      for p, r in cal.effective_tflops.items())
    print(f"calibrated local from {cal.runs} run(s): {rates}; memory x{cal.memory_scale:.3f}; "
          f"median fit error {cal.rel_error:.1%}")
    print(f"used: {', '.join(cal.used)}")
    if cal.rejected:
        print(f"rejected as outliers: {', '.join(cal.rejected)}")
    print(f"wrote {path}: forge run and forge plan use it for a recipe whose output is {Path(path).parent} "
          f"(elsewhere: forge plan --calibration {path}, or a recipe's compute.calibration)")
    return 0


def _plan_recipe(args, stack):
    """(plans, the local rate they used) of `forge plan RECIPE`: its calibration (--calibration,
    compute.calibration, else OUTPUT/calibration.yaml), else this machine measured (once: the
    measurement is cached in the output folder), else (--no-measure) the catalog's guess."""
    from forge.advice import warnings
    from forge.plan.recipe_plan import local_rate, plan_recipe, recipe_catalog
    from forge.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    for warning in warnings(recipe):  # starting-point advice, never a failure
        print(f"forge: warning: {warning}", file=sys.stderr)
    catalog = recipe_catalog(recipe, tuple(getattr(args, "hardware", []) or ()), getattr(args, "calibration", None))
    names = [t for t, _ in parse_targets(args.target or recipe.compute.target)]
    here = any(get_system(t, catalog).chip.key == LOCAL_CHIP for t in names)
    rate = local_rate(recipe, catalog, measure=here and not getattr(args, "no_measure", False), log=say,
                      precision=args.precision)
    plans = plan_recipe(recipe, args.target, Goal(args.chips, args.deadline, args.budget),
                        Setup(stack=stack, mfu=args.mfu), args.precision, catalog, local=rate)
    return plans, rate


def _anchors(leave_one_out: bool) -> int:
    """The anchors replayed; with leave_one_out each predicted from a refit without it (exit 1 when
    one misses +-20% out of sample)."""
    from forge.plan.anchors import format_replays, replay_all

    if not leave_one_out:
        print(format_replays(replay_all()), end="")
        return 0
    from forge.plan.holdout import format_holdouts, full_fit, leave_one_out as loo

    say("refitting the planner's fitted figures without each anchor in turn")
    rows = loo()
    print(format_holdouts(rows, full_fit()), end="")
    return 0 if all(h.within for h in rows) else 1


def _say_launchable(plans, catalog: dict) -> None:
    """A plan on a stack forge's loop does not run says so, and names the stack forge launch runs; a
    plan on a chip forge launch cannot start processes on (Trn1, an announced chip) says that instead."""
    from forge.plan.stacks import engine_data, forge_runs, launch_stack

    for p in plans:
        if not p.stack or p.stack == "local":
            continue
        try:
            chip = get_system(p.target, catalog).chip.key
        except ForgeError:  # a system only a recipe's own hardware file defines
            chip = ""
        refused = (engine_data()["chips"].get(chip) or {}).get("unsupported")
        if refused:
            p.notes.append(f"forge launch does not run on {p.chip}: {refused}")
        elif not forge_runs(p.stack):
            p.notes.append(f"forge does not run the {p.stack} stack; `forge launch` runs {launch_stack(p.stack)} "
                           f"(plan it with --stack {launch_stack(p.stack)})")


def run(args) -> int:
    validate(args)
    extra = tuple(getattr(args, "hardware", []) or ())
    if getattr(args, "calibration", None) and not getattr(args, "calibrate", False):
        if not Path(args.calibration).is_file():
            raise ForgeError(f"--calibration {args.calibration}: no such file (write one with --calibrate)")
        extra += (args.calibration,)
    catalog = load_catalog(extra)
    if getattr(args, "list_targets", False):
        print(_list_targets(catalog))
        return 0
    if getattr(args, "calibrate", False):
        return _calibrate(args)
    if getattr(args, "anchors", False):
        return _anchors(getattr(args, "leave_one_out", False))
    if getattr(args, "leave_one_out", False):
        raise ForgeError("--leave-one-out checks the anchors: give it with --anchors")
    stack, rate = getattr(args, "stack", None), None
    if getattr(args, "model", None):
        config = load_model_config(args.model)
        if args.tokens is None and args.steps is None:
            summary = model_summary(config)
            print(json.dumps(summary, indent=2) if args.json else format_model_summary(summary), end="\n" if args.json else "")
            return 0
        targets = parse_targets(args.target or "local")
        if args.chips:
            targets = [(t, args.chips) for t, _ in targets]
        plans = compare(config, _workload(args), targets, Goal(deadline_h=args.deadline, budget_usd=args.budget),
                        Setup(stack=stack, mfu=args.mfu), catalog)
    elif getattr(args, "recipe", None):
        plans, rate = _plan_recipe(args, stack)
    else:
        raise ForgeError("forge plan needs a recipe, --model CONFIG, --anchors, --calibrate or --list-targets")
    _refuse_absurd(plans)
    _say_launchable(plans, catalog)
    if args.json:
        print(to_json(plans))
    else:
        print(format_table(plans), end="")
    if rate is not None and any(p.target == "local" for p in plans):
        print(f"local rate: {rate.text}", file=sys.stderr if args.json else sys.stdout)
    if getattr(args, "plot", None):
        path = plot_plans(plans, args.plot)
        if not args.json:
            print(f"chart: {path}")
    return 0 if all(p.feasible for p in plans) else 1
