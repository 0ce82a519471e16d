"""`forge launch`: write, from the plan's layout, a job the user's engine runs unchanged.

    forge launch recipes/acme.yaml --engine torchrun --target h100:16 --out jobs/acme
    forge launch recipes/acme.yaml --engine slurm --target p5.48xlarge --nodes 4 --out jobs/acme
    forge launch recipes/acme.yaml --engine kubernetes --target trn2 --image REPO/forge:1 --out jobs/acme
    forge launch recipes/acme.yaml --engine sagemaker --target trn2.48xlarge --nodes 2 --out jobs/acme \
        --s3 s3://bucket/acme --role-arn arn:aws:iam::123456789012:role/sm [--submit]

Every job runs `forge run RECIPE` with the plan's chip count, target and stack as overrides (and
the parallelism strategy where the recipe schema has it). The layout is checked before anything is
written; OUT (a new or empty folder, or one forge launch wrote: out.py) gets the engine's files
and launch.json (the plan beside what was launched), all at once.
"""
from __future__ import annotations

import argparse
import json

from forge.errors import ForgeError
from forge.launch.engines import ENGINES
from forge.progress import say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The common flags, then each engine's own group (forge.launch.engines)."""
    engines = "; ".join(f"{e.name}: {e.summary}" for e in ENGINES.values())
    parser.add_argument("recipe", help="recipe YAML the job runs")
    parser.add_argument("--engine", required=True, choices=list(ENGINES), help=engines)
    parser.add_argument("--target", required=True, help="NAME[:CHIPS] as in forge plan --target (trn2, h100:16, ...)")
    parser.add_argument("--nodes", type=int, help="nodes (instances) to run on (default: as many as the plan needs)")
    parser.add_argument("--out", required=True,
                        help="folder the job files are written to: new, empty, or written by an earlier forge launch")
    parser.add_argument("--image", help="container image (kubernetes, sagemaker); default: the target's DLC")
    parser.add_argument("--region", default="us-east-1", help="the region of the default image and of the job")
    starts = [e.name for e in ENGINES.values() if e.submit is not None]
    parser.add_argument("--submit", action="store_true", help=f"start the job ({', '.join(starts)})")
    for engine in ENGINES.values():
        engine.flags(parser.add_argument_group(engine.name))


def header(launch) -> list[str]:
    head = [f"forge launch {launch.recipe}: {launch.nodes} node(s) x {launch.chips_per_node} {launch.chip} "
            f"({launch.chips} chips, {launch.world} processes, {launch.strategy}, stack {launch.stack})"]
    for p in launch.plans:
        head.append(f"plan {p.stage}: {p.layout} on {p.target} x{p.chips}, {p.step_time_s:.3g} s/step, "
                    f"{p.hours:,.2f} h, ${p.cost_usd:,.0f}")
    return head + [f"note: {n}" for n in launch.notes]


def render(args, launch, recipe) -> tuple[dict[str, str], object]:
    """Every file of the job (nothing written yet), and what the engine's submit needs."""
    engine = ENGINES[args.engine]
    if engine.cluster and launch.target == "local":
        local = [e.name for e in ENGINES.values() if not e.cluster]
        raise ForgeError(f"--engine {args.engine} runs on a cluster; --target local is this machine "
                         f"(use --engine {' or '.join(local)})")
    return engine.rendered(args, launch, recipe, header(launch))


def run(args) -> int:
    from forge.launch.layout import plan_launch
    from forge.launch.out import check_out, write_job
    from forge.recipe import load_recipe

    for what, value in (("recipe", args.recipe), ("--out", args.out)):
        if any("\udc80" <= c <= "\udcff" for c in value):  # bytes that are not UTF-8, as Python decodes a name
            raise ForgeError(f"{what} {value!r}: the name is not valid UTF-8; rename it (no script or job file "
                             "could carry it, nor a terminal print it)")
    say(f"forge launch {args.recipe}: planning a {args.engine} job on {args.target}")
    out = check_out(args.out)
    recipe = load_recipe(args.recipe)
    launch = plan_launch(args.recipe, args.target, args.nodes, recipe=recipe)
    engine = ENGINES[args.engine]
    if args.submit and engine.submit is None:
        starts = [e.name for e in ENGINES.values() if e.submit is not None]
        raise ForgeError(f"--submit starts {', '.join(starts)} jobs; a {args.engine} job is started with its "
                         "engine's own command")
    files, job = render(args, launch, recipe)   # every refusal comes before this point
    files["launch.json"] = json.dumps(launch.record(), indent=2, default=str) + "\n"
    write_job(out, files)
    for line in header(launch):
        print(line)
    print(f"wrote {', '.join(str(out / n) for n in files)}")
    if args.submit:
        print(f"started {engine.submitted(args, launch, recipe, job, out)}")
    return 0
