"""`forge export` and `forge deploy`: argument parsing, delegating to forge.export's modules (imported
after the command's first line: they load torch)."""
from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from forge.errors import ForgeError
from forge.export.formats import FORMATS, deploying
from forge.progress import phase
from forge.quiet import quiet_libraries

SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?", re.IGNORECASE)
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9, '512MiB' -> 512 * 2**20, '1000' -> 1000 bytes."""
    m = SIZE.fullmatch(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ForgeError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * UNITS[(m.group(2) or "b").lower()])


def add_subcommands(sub) -> None:
    text = "write a Novella in an export format's layout (Bedrock Custom Model Import by default)"
    p = sub.add_parser("export", help=text, description=text)
    p.add_argument("source", help="a Novella folder, models:/NAME@ALIAS (or models:/NAME/VERSION), or an MLflow run id")
    p.add_argument("--out", required=True, help="a new folder to write (or, with --overwrite, an earlier export)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the folder at --out if an earlier forge export wrote it (never anything else)")
    p.add_argument("--format", choices=list(FORMATS), default="bedrock",
                   help="; ".join(f"{f.name}: {f.summary}" for f in FORMATS.values()) + " (default: bedrock)")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    p.add_argument("--model-name", help="importedModelName (default: the recipe's name)")
    p.add_argument("--job-name", help="jobName (default: model name and time)")
    p.add_argument("--role-arn", help="with --s3-uri: write bedrock-import-job.json now (--format "
                   f"{' or '.join(deploying())})")
    p.add_argument("--s3-uri", help="where the export will be uploaded (s3://bucket/prefix)")
    p.add_argument("--chat-template", type=Path, help="a Jinja chat template file to ship instead of the model's")
    p.add_argument("--tracking-uri", help="MLflow store holding the source (default: MLFLOW_TRACKING_URI, or "
                   "the store beside a forge run's novella folder)")
    p.add_argument("--verify", action="store_true",
                   help="reload the export, compare logits with the source, generate text")
    p.set_defaults(func=run_export)

    text = "upload an export to S3 and start an Amazon Bedrock Custom Model Import job"
    p = sub.add_parser("deploy", help=text, description=text + ". AWS credentials come from the standard chain.")
    p.add_argument("folder", type=Path, help=f"a folder written by forge export --format {' or '.join(deploying())}")
    p.add_argument("--s3-uri", required=True, help="s3://bucket/prefix to upload to")
    p.add_argument("--role-arn", required=True, help="IAM role Bedrock assumes to read the bucket")
    p.add_argument("--region", help="AWS region (default: the standard chain's)")
    p.add_argument("--job-name", help="jobName (default: model name and time)")
    p.add_argument("--dry-run", action="store_true", help="write and validate the job request; send nothing")
    p.add_argument("--no-wait", action="store_true", help="return once the job is submitted")
    p.add_argument("--poll-seconds", type=float, default=30)
    p.add_argument("--timeout-minutes", type=float, default=240)
    p.add_argument("--part-size-mb", type=int, default=64, help="multipart upload part size (at least 5)")
    p.add_argument("--tracking-uri", help="MLflow store to record the deployment in (default: the manifest's)")
    p.set_defaults(func=run_deploy)


def run_export(args: argparse.Namespace) -> int:
    template = None
    if args.chat_template is not None:
        if not args.chat_template.is_file():
            raise ForgeError(f"--chat-template {args.chat_template}: no such file")
        template = args.chat_template.read_text()
    if bool(args.role_arn) != bool(args.s3_uri):
        raise ForgeError("--role-arn and --s3-uri go together (they make bedrock-import-job.json)")
    # the first line, before torch loads (a refusal of the arguments above comes before it)
    with phase(f"forge export {args.source} -> {args.out} ({args.format}, {args.dtype}): loading torch, "
               "transformers and MLflow", done=False):
        quiet_libraries()
        from forge.export.layout import ExportOptions, export
        from forge.export.source import resolve

    opts = ExportOptions(format=args.format, dtype=args.dtype, max_shard_bytes=parse_size(args.max_shard_size),
                         model_name=args.model_name, job_name=args.job_name, role_arn=args.role_arn,
                         s3_uri=args.s3_uri.rstrip("/") + "/" if args.s3_uri else None,
                         chat_template=template, verify=args.verify, overwrite=args.overwrite)
    with tempfile.TemporaryDirectory(prefix="forge-export-") as work:
        src = resolve(args.source, args.tracking_uri, Path(work))
        export(src, Path(args.out), opts)
    return 0


def run_deploy(args: argparse.Namespace) -> int:
    dry = " (a dry run: nothing is sent)" if args.dry_run else ""
    with phase(f"forge deploy {args.folder} -> {args.s3_uri}{dry}: loading boto3, torch and MLflow", done=False):
        quiet_libraries()
        from forge.export.deploy import DeployOptions, deploy

    opts = DeployOptions(region=args.region, dry_run=args.dry_run, job_name=args.job_name, wait=not args.no_wait,
                         poll_seconds=args.poll_seconds, timeout_seconds=args.timeout_minutes * 60,
                         part_size=args.part_size_mb * 1024**2, tracking_uri=args.tracking_uri)
    report = deploy(args.folder, args.s3_uri, args.role_arn, opts)
    if "job_arn" in report:
        status = report.get("status", "submitted")
        print(f"import job {report['job_name']}: {status}" +
              (f"; model {report['imported_model_arn']}" if report.get("imported_model_arn") else ""))
    return 0
