"""SageMaker training jobs (ml.trn2 / ml.trn3 with the Neuron deep-learning container, ml.p5 with the
PyTorch one): a `CreateTrainingJob` request whose input channels are the recipe, forge's source and
the recipe's data and base (channels.py); validated against botocore's service model; submitted
with boto3 only when asked, each file streamed to S3. The job runs forge-launch.sh (in the code
channel): install forge, then torchrun on each instance with the node rank SageMaker's
resourceconfig.json gives."""
from __future__ import annotations

import functools
import json
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.launch.channels import ML, Input, job_inputs
from forge.launch.layout import PORT, Launch
from forge.launch.quote import Live, comments, shell_line
from forge.plan.stacks import engine_data

REQUEST = "create-training-job.json"
ENTRY = "forge-launch.sh"
CODE_TAR = "forge-src.tar.gz"
CHECKPOINTS = "/opt/ml/checkpoints"
MAX_RUNTIME = 28 * 24 * 3600          # SageMaker's longest training job
HOSTS = "import json;c=json.load(open('/opt/ml/input/config/resourceconfig.json'));"


@dataclass(frozen=True)
class Options:
    s3: str                   # s3://bucket/prefix: channels, output and checkpoints live under it
    role_arn: str
    region: str
    job_name: str
    image: str = ""           # default: the family's image (engines.yaml)
    instance_type: str = ""   # default: the system's (engines.yaml)


def instance_type(launch: Launch, asked: str) -> str:
    kind = asked or engine_data()["sagemaker_instances"].get(launch.target, "")
    if not kind:
        raise ForgeError(f"--engine sagemaker: no SageMaker training instance type is known for {launch.target} "
                         "(botocore's TrainingInstanceType has none yet); pass --instance-type ml.<type> once one exists")
    return kind


def _channel(name: str, uri: str) -> dict:
    return {"ChannelName": name, "InputMode": "File", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}}}


def moved_overrides(recipe, inputs: dict[str, Input]) -> tuple[str, ...]:
    """Overrides pointing the recipe's inputs at their channels, and its output at the checkpoint
    folder SageMaker syncs to S3."""
    return (f"output={CHECKPOINTS}/{recipe.name}", *(f"{i.field}={i.in_job}" for i in inputs.values()))


def entry_script(launch: Launch, recipe_file: str, moved: tuple[str, ...]) -> str:
    """forge-launch.sh: what each instance runs."""
    args = ["torchrun", "--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.procs_per_node),
            "--node-rank", Live("$NODE_RANK"), "--master-addr", Live("$HEAD"), "--master-port", str(PORT),
            *launch.run_args(f"{ML}/recipe/{recipe_file}", moved)]
    return "\n".join([
        "#!/usr/bin/env bash",
        *comments([f"forge launch: {launch.recipe} on {launch.target} ({launch.nodes} instance(s))"]),
        "set -euo pipefail", f"pip install --quiet {ML}/code/{CODE_TAR}",
        f'NODE_RANK=$(python -c "{HOSTS}print(sorted(c[\'hosts\']).index(c[\'current_host\']))")',
        f'HEAD=$(python -c "{HOSTS}print(sorted(c[\'hosts\'])[0])")', f"exec {shell_line(args)}", ""])


def request(launch: Launch, recipe, opts: Options) -> tuple[dict, dict[str, Input]]:
    """(the CreateTrainingJob request, each channel's input); raises ForgeError for an input the
    job could not reach, or unless botocore's model accepts the request."""
    s3 = opts.s3.rstrip("/")
    if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?", s3):
        raise ForgeError(f"--s3 {opts.s3!r}: expected s3://BUCKET[/PREFIX]")
    inputs = job_inputs(recipe)
    family = engine_data()["chips"][launch.chip]["image"]
    image = opts.image or engine_data()["images"][family].format(region=opts.region)
    channels = [_channel("recipe", f"{s3}/recipe/"), _channel("code", f"{s3}/code/")]
    channels += [_channel(name, inp.s3 or f"{s3}/{name}/") for name, inp in inputs.items()]
    hours = max((p.hours for p in launch.plans), default=0.0)
    req = {
        "TrainingJobName": opts.job_name, "RoleArn": opts.role_arn,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File",
                                   "ContainerEntrypoint": ["bash", f"{ML}/code/{ENTRY}"]},
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": f"{s3}/output/"},
        "ResourceConfig": {"InstanceType": instance_type(launch, opts.instance_type), "InstanceCount": launch.nodes,
                           "VolumeSizeInGB": 500},
        "StoppingCondition": {"MaxRuntimeInSeconds": int(min(MAX_RUNTIME, 3600 + 2 * hours * 3600))},
        "CheckpointConfig": {"S3Uri": f"{s3}/checkpoints/", "LocalPath": CHECKPOINTS},
        "Environment": {"TOKENIZERS_PARALLELISM": "false"},
        "Tags": [{"Key": "forge:recipe", "Value": launch.name[:256]}, {"Key": "forge:target", "Value": launch.target}],
    }
    bad = problems(req)
    if bad:
        raise ForgeError(f"{REQUEST}: botocore's sagemaker model refuses the request: {bad[0]}")
    return req, inputs


@functools.lru_cache(maxsize=1)
def _input_shape():
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob").input_shape


def problems(req: dict) -> list[str]:
    """Where `req` breaks botocore's CreateTrainingJob input shape."""
    from forge.launch.shape import shape_problems

    return shape_problems(req, _input_shape(), "")


def write_code_archive(path: Path) -> Path:
    """forge's source (pyproject.toml, README.md, forge/, pipelines/) as the code channel's tarball."""
    import forge

    root = Path(forge.__file__).resolve().parent.parent
    with tarfile.open(path, mode="w:gz") as tar:
        for name in ("pyproject.toml", "README.md", "forge", "pipelines"):
            if (root / name).exists():
                tar.add(root / name, arcname=f"forge-src/{name}",
                        filter=lambda t: None if "__pycache__" in t.name or t.name.endswith(".pyc") else t)
    return path


def uploads(req: dict, recipe_path: str, inputs: dict[str, Input], entry: Path,
            code: Path) -> list[tuple[str, str, Path]]:
    """(bucket, key, local file) of every object forge uploads for the job: recipe, entry script,
    code and the local inputs (an S3 source's channel is read where it is)."""
    def where(channel: str) -> tuple[str, str]:
        uri = next(c["DataSource"]["S3DataSource"]["S3Uri"] for c in req["InputDataConfig"] if c["ChannelName"] == channel)
        bucket, _, key = uri[len("s3://"):].partition("/")
        return bucket, key

    bucket, key = where("recipe")
    out = [(bucket, key + Path(recipe_path).name, Path(recipe_path))]
    bucket, key = where("code")
    out += [(bucket, key + ENTRY, entry), (bucket, key + CODE_TAR, code)]
    for channel, inp in inputs.items():
        if inp.local is None:
            continue
        bucket, key = where(channel)
        path = inp.local
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [(bucket, key + f.relative_to(path.parent).as_posix(), f) for f in files]
    return out


def submit(req: dict, objects: list[tuple[str, str, Path]], sagemaker_client, s3_client, part_size: int) -> str:
    """Stream each file to S3 (multipart above `part_size`: no file is held in memory, and no part
    nears S3's 5 GB limit on one put), then create the job; returns its ARN. Nothing about the
    caller's credentials is printed or returned."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=4)
    for bucket, key, path in objects:
        s3_client.upload_file(str(path), bucket, key, Config=config)
    return str(sagemaker_client.create_training_job(**req)["TrainingJobArn"])


def check_bucket(s3_client, s3: str) -> None:
    """The --s3 bucket exists and this caller may write to it, else a ForgeError saying which."""
    from botocore.exceptions import ClientError

    bucket = s3[len("s3://"):].split("/", 1)[0]
    try:
        s3_client.head_bucket(Bucket=bucket)
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise ForgeError(f"--s3 {s3}: no such bucket {bucket!r} (nothing was uploaded)") from None
        if code in ("403", "AccessDenied", "Forbidden"):
            raise ForgeError(f"--s3 {s3}: access to bucket {bucket!r} denied (nothing was uploaded)") from None
        raise


MIN_PART_MB, MAX_PART_MB = 5, 5 * 1024   # S3's smallest multipart part, and its largest single put


def rendered(args: Any, launch: Launch, recipe: Any, header: list[str]) -> tuple[dict[str, str], tuple]:
    """The engine table's entry (forge.launch.engines): the request and entry script, and for
    `submitted` the request and its inputs."""
    missing = [f for f in ("s3", "role_arn") if not getattr(args, f, None)]
    if missing:
        raise ForgeError(f"--engine sagemaker needs {' and '.join('--' + m.replace('_', '-') for m in missing)}")
    if not MIN_PART_MB <= args.part_size_mb <= MAX_PART_MB:
        raise ForgeError(f"--part-size-mb {args.part_size_mb}: S3 takes parts of {MIN_PART_MB} to {MAX_PART_MB} MB")
    name = args.job_name or f"forge-{launch.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    opts = Options(args.s3, args.role_arn, args.region, name.replace("_", "-").replace(".", "-")[:63],
                   args.image or "", args.instance_type or "")
    req, inputs = request(launch, recipe, opts)
    entry = entry_script(launch, Path(launch.recipe).name, moved_overrides(recipe, inputs))
    return {REQUEST: json.dumps(req, indent=2) + "\n", ENTRY: entry}, (req, inputs)


def submitted(args: Any, launch: Launch, recipe: Any, job: tuple, out: Path) -> str:
    """Check that the bucket and every S3 source are there, then stream the files and create the job."""
    import tempfile

    import boto3

    from forge.errors import aws_errors
    from forge.launch.channels import check_s3_sources
    from forge.progress import say

    req, inputs = job
    with aws_errors():
        session = boto3.session.Session(region_name=args.region)
        s3, sm = session.client("s3"), session.client("sagemaker")
        check_bucket(s3, args.s3)
        check_s3_sources(inputs, recipe, s3)
        with tempfile.TemporaryDirectory(prefix="forge-launch-") as tmp:
            code = write_code_archive(Path(tmp) / CODE_TAR)
            objects = uploads(req, launch.recipe, inputs, out / ENTRY, code)
            say(f"uploading {len(objects)} file(s) under {args.s3} and creating training job {req['TrainingJobName']}")
            return submit(req, objects, sm, s3, args.part_size_mb * 1024**2)
