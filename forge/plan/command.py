"""`forge plan`: what a stage costs and whether it fits, from a recipe or from a model config.

    forge plan recipes/acme.yaml --target trn3,trn2,h100:64
    forge plan --model llama-3.1-8b --stage pretrain --tokens 100B --seq-len 8192 \
        --target trn3-ultraserver,trn2-ultraserver,h100:64
    forge plan --model ./ckpt --tokens 2B --target trn2 --deadline 24
    forge plan --calibrate [--runs DIR]
    forge plan --list-targets

Exit status: 0 when every planned stage fits, 1 when one does not (the table says why).
"""
from __future__ import annotations

import argparse
import re

from forge.errors import ForgeError
from forge.plan import workloads as W
from forge.plan.calibrate import calibrate, default_store_dir
from forge.plan.hardware import get_system, known_targets, load_catalog, parse_targets
from forge.plan.model import load_model_config
from forge.plan.planner import compare
from forge.plan.report import format_table, plot_plans, to_json

DEFAULT_BATCH_TOKENS = 4 * 2**20     # ~4M tokens per step when --global-batch is not given


def parse_count(text: str) -> float:
    """'100B' -> 1e11, '2.5M' -> 2.5e6, '1e9' -> 1e9."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([kKmMbBtT]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (use e.g. 100B, 2.5M, 1e9)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    return float(m.group(1)) * scale


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="recipe YAML to plan (or use --model)")
    parser.add_argument("--target", help="target name(s), comma separated, NAME[:CHIPS] (see --list-targets)")
    parser.add_argument("--chips", type=int, help="plan at exactly this many chips")
    parser.add_argument("--deadline", type=float, metavar="HOURS", help="fewest chips that finish in time")
    parser.add_argument("--budget", type=float, metavar="USD", help="fastest plan within this cost")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.add_argument("--plot", metavar="PNG", help="write a chart of time and cost across targets")
    parser.add_argument("--mfu", type=float, help="override the catalog's assumed MFU")
    parser.add_argument("--precision", help="override the stage precision (bf16, fp8, fp32, ...)")
    parser.add_argument("--hardware", action="append", default=[], metavar="YAML",
                        help="extra hardware catalog file(s) merged over the built-in one")
    parser.add_argument("--list-targets", action="store_true", help="list known targets and exit")
    parser.add_argument("--calibrate", action="store_true", help="fit the local machine from past runs")
    parser.add_argument("--runs", metavar="DIR", help="where runs recorded measurements (for --calibrate)")
    g = parser.add_argument_group("planning without a recipe")
    g.add_argument("--model", help="config.json, checkpoint dir, or preset (e.g. llama-3.1-8b)")
    g.add_argument("--stage", default="pretrain", help="pretrain | midtrain | sft | dpo | rft")
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


def _workload(args) -> W.Workload:
    kind = W.normalize_kind(args.stage)
    seq = args.seq_len
    batch = args.global_batch or max(1, DEFAULT_BATCH_TOKENS // seq)
    prec = args.precision or "bf16"
    name = kind
    if kind in ("pretrain", "midtrain"):
        return W.pretrain(name, seq, batch, args.tokens, args.steps, prec, kind=kind)
    if kind == "sft":
        return W.sft(name, seq, batch, args.tokens, args.steps, prec, packed=not args.unpacked,
                     mean_example_len=args.mean_example_len)
    if kind == "dpo":
        pairs = args.tokens / (2 * seq) if args.tokens else None
        return W.dpo(name, seq, batch, pairs, args.steps, prec, cached_reference=not args.no_cached_reference)
    prompt = args.prompt_len or seq // 4
    steps = args.steps or (int(args.tokens // (batch * args.group * (seq - prompt))) if args.tokens else None)
    if not steps:
        raise ForgeError("rft planning needs --steps (or --tokens of generated text)")
    return W.rft(name, prompt, seq - prompt, batch, args.group, max(1, steps), prec, args.reward_model)


def _list_targets(catalog: dict) -> str:
    rows = [f"{'target':<24}{'chip':<34}{'default':>8}{'$/chip-h':>10}  price"]
    for key in known_targets(catalog):
        s = get_system(key, catalog)
        rows.append(f"{key:<24}{s.chip.name:<34}{s.default_chips:>8}{s.usd_per_chip_hour:>10.3f}  {s.price_kind}")
    aliases = catalog.get("aliases", {})
    rows.append("aliases: " + ", ".join(f"{a}={t}" for a, t in sorted(aliases.items())))
    return "\n".join(rows)


def run(args) -> int:
    catalog = load_catalog(tuple(getattr(args, "hardware", []) or ()))
    if getattr(args, "list_targets", False):
        print(_list_targets(catalog))
        return 0
    if getattr(args, "calibrate", False):
        cal, path = calibrate(getattr(args, "runs", None) or default_store_dir())
        rates = ", ".join(f"{p}: {r:.4g} TFLOP/s + {cal.step_overhead_s[p]:.3g} s/step"
                          for p, r in cal.effective_tflops.items())
        print(f"calibrated local from {cal.runs} run(s): {rates}; memory x{cal.memory_scale:.3f}; "
              f"median fit error {cal.rel_error:.1%}\nwrote {path}")
        return 0
    if getattr(args, "model", None):
        config = load_model_config(args.model)
        targets = parse_targets(args.target or "local")
        if args.chips:
            targets = [(t, args.chips) for t, _ in targets]
        plans = compare(config, _workload(args), targets, deadline_h=args.deadline, budget_usd=args.budget,
                        mfu=args.mfu, catalog=catalog)
    elif getattr(args, "recipe", None):
        from forge.plan.recipe_plan import plan_recipe
        from forge.recipe import load_recipe

        plans = plan_recipe(load_recipe(args.recipe), target=args.target, chips=args.chips,
                            deadline_h=args.deadline, budget_usd=args.budget, mfu=args.mfu,
                            precision=args.precision, catalog=catalog)
    else:
        raise ForgeError("forge plan needs a recipe, --model CONFIG, --calibrate or --list-targets")
    if args.json:
        print(to_json(plans))
    else:
        print(format_table(plans), end="")
    if getattr(args, "plot", None):
        path = plot_plans(plans, args.plot)
        if not args.json:
            print(f"chart: {path}")
    return 0 if all(p.feasible for p in plans) else 1
