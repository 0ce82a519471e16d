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
import time
from pathlib import Path

from forge.errors import ForgeError, aws_errors
from forge.progress import say

ENGINES = ("torchrun", "slurm", "kubernetes", "sagemaker")
MIN_PART_MB, MAX_PART_MB = 5, 5 * 1024   # S3's smallest multipart part, and its largest single put


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe YAML the job runs")
    parser.add_argument("--engine", required=True, choices=ENGINES)
    parser.add_argument("--target", required=True, help="NAME[:CHIPS] as in forge plan --target (trn2, h100:16, ...)")
    parser.add_argument("--nodes", type=int, help="nodes (instances) to run on (default: as many as the plan needs)")
    parser.add_argument("--out", required=True,
                        help="folder the job files are written to: new, empty, or written by an earlier forge launch")
    parser.add_argument("--image", help="container image (kubernetes, sagemaker); default: the target's DLC")
    parser.add_argument("--workdir", default="/workspace", help="kubernetes: where the pods see the checkout and data")
    parser.add_argument("--volume-claim", default="forge-work", help="kubernetes: the PVC mounted at --workdir")
    parser.add_argument("--s3", help="sagemaker: s3://BUCKET/PREFIX for the channels, output and checkpoints")
    parser.add_argument("--role-arn", help="sagemaker: the job's execution role")
    parser.add_argument("--region", default="us-east-1", help="sagemaker: the job's region")
    parser.add_argument("--job-name", help="sagemaker: the training job's name (default: forge-RECIPE-TIME)")
    parser.add_argument("--instance-type", help="sagemaker: override the ml.* instance type")
    parser.add_argument("--submit", action="store_true", help="sagemaker: upload the channels and create the job (boto3)")
    parser.add_argument("--part-size-mb", type=int, default=64,
                        help="sagemaker --submit: files above this size are uploaded in parts of this size (5..5120)")


def header(launch) -> list[str]:
    head = [f"forge launch {launch.recipe}: {launch.nodes} node(s) x {launch.chips_per_node} {launch.chip} "
            f"({launch.chips} chips, {launch.world} processes, {launch.strategy}, stack {launch.stack})"]
    for p in launch.plans:
        head.append(f"plan {p.stage}: {p.layout} on {p.target} x{p.chips}, {p.step_time_s:.3g} s/step, "
                    f"{p.hours:,.2f} h, ${p.cost_usd:,.0f}")
    return head + [f"note: {n}" for n in launch.notes]


def render(args, launch, recipe) -> tuple[dict[str, str], tuple | None]:
    """Every file of the job (nothing written yet), and for SageMaker (request, inputs, entry script)."""
    from forge.plan.launch import kubernetes, slurm, torchrun
    from forge.plan.launch.layout import engine_data

    info = engine_data()["chips"][launch.chip]
    head = header(launch)
    if args.engine != "torchrun" and launch.target == "local":
        raise ForgeError(f"--engine {args.engine} runs on a cluster; --target local is this machine (use --engine torchrun)")
    if args.engine == "torchrun":
        return torchrun.render(launch, head), None
    if args.engine == "slurm":
        return slurm.render(launch, head, bool(info["slurm_gpus"])), None
    if args.engine == "kubernetes":
        default = engine_data()["images"][info["image"]].format(region=args.region)
        image = args.image if args.image is not None else default   # an empty --image is refused, not defaulted
        return kubernetes.render(launch, head, image, args.workdir, args.volume_claim, info["k8s_resource"]), None
    return _sagemaker(args, launch, recipe)


def _sagemaker(args, launch, recipe) -> tuple[dict[str, str], tuple]:
    from forge.plan.launch import sagemaker

    missing = [f for f in ("s3", "role_arn") if not getattr(args, f, None)]
    if missing:
        raise ForgeError(f"--engine sagemaker needs {' and '.join('--' + m.replace('_', '-') for m in missing)}")
    name = args.job_name or f"forge-{launch.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    opts = sagemaker.Options(args.s3, args.role_arn, args.region, name.replace("_", "-").replace(".", "-")[:63],
                             args.image or "", args.instance_type or "")
    req, inputs = sagemaker.request(launch, recipe, opts)
    entry = sagemaker.entry_script(launch, Path(launch.recipe).name, sagemaker.moved_overrides(recipe, inputs))
    return {sagemaker.REQUEST: json.dumps(req, indent=2) + "\n", sagemaker.ENTRY: entry}, (req, inputs)


def run(args) -> int:
    from forge.plan.launch.layout import plan_launch
    from forge.plan.launch.out import check_out, write_job
    from forge.recipe import load_recipe

    for what, value in (("recipe", args.recipe), ("--out", args.out)):
        if any("\udc80" <= c <= "\udcff" for c in value):  # bytes that are not UTF-8, as Python decodes a name
            raise ForgeError(f"{what} {value!r}: the name is not valid UTF-8; rename it (no script or job file "
                             "could carry it, nor a terminal print it)")
    say(f"forge launch {args.recipe}: planning a {args.engine} job on {args.target}")
    out = check_out(args.out)
    recipe = load_recipe(args.recipe)
    launch = plan_launch(args.recipe, args.target, args.nodes, recipe=recipe)
    if args.submit and args.engine != "sagemaker":
        raise ForgeError(f"--submit starts SageMaker jobs; a {args.engine} job is started with its engine's own command")
    if not MIN_PART_MB <= args.part_size_mb <= MAX_PART_MB:
        raise ForgeError(f"--part-size-mb {args.part_size_mb}: S3 takes parts of {MIN_PART_MB} to {MAX_PART_MB} MB")
    files, job = render(args, launch, recipe)   # every refusal comes before this point
    files["launch.json"] = json.dumps(launch.record(), indent=2, default=str) + "\n"
    write_job(out, files)
    for line in header(launch):
        print(line)
    print(f"wrote {', '.join(str(out / n) for n in files)}")
    if args.submit and job is not None:
        print(f"started {_submit(args, launch, recipe, job, out)}")
    return 0


def _submit(args, launch, recipe, job: tuple, out: Path) -> str:
    """Check that the bucket and every S3 source are there, then stream the files and create the job."""
    import tempfile

    import boto3

    from forge.plan.launch import sagemaker
    from forge.plan.launch.channels import check_s3_sources

    req, inputs = job
    with aws_errors():
        session = boto3.session.Session(region_name=args.region)
        s3, sm = session.client("s3"), session.client("sagemaker")
        sagemaker.check_bucket(s3, args.s3)
        check_s3_sources(inputs, recipe, s3)
        with tempfile.TemporaryDirectory(prefix="forge-launch-") as tmp:
            code = sagemaker.write_code_archive(Path(tmp) / sagemaker.CODE_TAR)
            objects = sagemaker.uploads(req, launch.recipe, inputs, out / sagemaker.ENTRY, code)
            say(f"uploading {len(objects)} file(s) under {args.s3} and creating training job {req['TrainingJobName']}")
            return sagemaker.submit(req, objects, sm, s3, args.part_size_mb * 1024**2)
