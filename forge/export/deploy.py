"""`forge deploy`: upload an export to S3 and start an Amazon Bedrock Custom Model Import job.

Uploads are multipart above `part_size` and resumable: an object whose stored sha256 (object
metadata written by forge) and size match the manifest is skipped. Then `CreateModelImportJob`
with the validated request, and `GetModelImportJob` polled until the job completes or fails.
Credentials come from boto3's standard chain; forge never reads, prints or stores them.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from forge.errors import ForgeError, aws_errors
from forge.export import bedrock
from forge.export.formats import FORMATS, Format, deploying
from forge.export.layout import JOB_REQUEST, MANIFEST, redact_uri, sha256, write_job_request

MIN_PART = 5 * 1024**2  # S3's smallest multipart part
S3_URI = re.compile(r"s3://([a-z0-9][-.a-z0-9]{1,61}[a-z0-9])(?:/(.*))?")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/a/b' -> ('bucket', 'a/b/'): the prefix is a folder."""
    m = S3_URI.fullmatch(uri)
    if not m:
        raise ForgeError(f"--s3-uri {uri!r}: expected s3://bucket/prefix (a lowercase bucket name)")
    prefix = (m.group(2) or "").strip("/")
    return m.group(1), f"{prefix}/" if prefix else ""


def read_manifest(folder: Path) -> tuple[dict, Format]:
    """An export's manifest and its format's row; a ForgeError where the format is not one deploy takes."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ForgeError(f"{folder}: no {MANIFEST} (not a forge export; run forge export first)")
    manifest = json.loads(path.read_text())
    fmt = FORMATS.get(manifest.get("format", ""))
    if fmt is None or not fmt.deploys:
        raise ForgeError(f"{folder}: exported with --format {manifest.get('format')}; deploy needs --format "
                         f"{' or '.join(deploying())}")
    return manifest, fmt


def upload(folder: Path, s3, bucket: str, prefix: str, manifest: dict, part_size: int = 64 * 1024**2,
           log=print) -> dict:
    """Upload the manifest's files (and the manifest); skip objects already there with the same hash."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    if part_size < MIN_PART:
        raise ForgeError(f"--part-size-mb must be at least {MIN_PART // 1024**2} (S3's smallest part)")
    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)
    files = {**manifest["files"], MANIFEST: {"sha256": sha256(folder / MANIFEST),
                                             "bytes": (folder / MANIFEST).stat().st_size}}
    done: dict[str, list[str]] = {"uploaded": [], "skipped": []}
    for name, expected in files.items():
        path, key = folder / name, prefix + name
        if not path.is_file() or (name != MANIFEST and sha256(path) != expected["sha256"]):
            raise ForgeError(f"{path}: missing or changed since export (sha256 differs from {MANIFEST})")
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
            head = None
        if head and head.get("Metadata", {}).get("sha256") == expected["sha256"] \
                and head.get("ContentLength") == expected["bytes"]:
            done["skipped"].append(name)
            continue
        s3.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": expected["sha256"]}}, Config=config)
        done["uploaded"].append(name)
        log(f"  uploaded s3://{bucket}/{key} ({expected['bytes'] / 1e6:.1f} MB)")
    return done


def wait_for_job(client, job_arn: str, poll_seconds: float, timeout_seconds: float, log=print,
                 sleep=time.sleep) -> dict:
    """Poll GetModelImportJob until Completed or Failed (ForgeError with Bedrock's message), or timeout."""
    waited = 0.0
    while True:
        job = client.get_model_import_job(jobIdentifier=job_arn)
        status = job["status"]
        if status == "Failed":
            raise ForgeError(f"import job {job['jobName']} failed: {job.get('failureMessage', 'no message')}")
        if status == "Completed" or waited >= timeout_seconds:
            return job
        log(f"  import job {job['jobName']}: {status}")
        sleep(poll_seconds)
        waited += poll_seconds


@dataclass
class DeployOptions:
    """How `forge deploy` runs: where, under which job name, whether it waits for the import."""

    region: str | None = None
    dry_run: bool = False            # touch no AWS API: say what would be uploaded and submitted
    job_name: str | None = None      # default: the model name and a timestamp
    wait: bool = True                # poll the import job until it completes or fails
    poll_seconds: float = 30
    timeout_seconds: float = 4 * 3600
    part_size: int = 64 * 1024**2    # multipart upload part size
    tracking_uri: str | None = None  # where the Novella's run is (default: the manifest's)


def deploy(folder: Path, s3_uri: str, role_arn: str, opts: DeployOptions | None = None, session=None,
           log=print) -> dict:
    """Upload `folder` (a bedrock export) to `s3_uri` and import it; `opts.dry_run` touches no AWS API.
    `session`: a boto3 Session (tests pass one with moto/Stubber clients); default: the standard chain."""
    opts = opts or DeployOptions()
    region, dry_run, job_name, wait = opts.region, opts.dry_run, opts.job_name, opts.wait
    folder = Path(folder)
    manifest, fmt = read_manifest(folder)
    bucket, prefix = parse_s3_uri(s3_uri)
    uri = f"s3://{bucket}/{prefix}"
    job = job_name or bedrock.job_name(manifest["names"]["importedModelName"])
    request = write_job_request(folder, fmt, role_arn, uri, job)  # validated against botocore's model
    report = {"s3_uri": uri, "request": str(folder / JOB_REQUEST), "job_name": job}
    if dry_run:
        report["would_upload"] = sorted([*manifest["files"], MANIFEST])
        log(f"dry run: would upload {len(report['would_upload'])} files to {uri} and submit "
            f"{folder / JOB_REQUEST} (jobName {job}); nothing sent")
        return report
    import boto3

    with aws_errors():
        session = session or boto3.Session(region_name=region)
        s3, client = session.client("s3"), session.client("bedrock")
        log(f"uploading {folder} to {uri}")
        report.update(upload(folder, s3, bucket, prefix, manifest, opts.part_size, log))
        log(f"  {len(report['uploaded'])} uploaded, {len(report['skipped'])} already there (same sha256)")
        response = client.create_model_import_job(**request)
        report["job_arn"] = response["jobArn"]
        log(f"import job started: {response['jobArn']}")
        if wait:
            final = wait_for_job(client, response["jobArn"], opts.poll_seconds, opts.timeout_seconds, log)
            report["status"] = final["status"]
            report["imported_model_arn"] = final.get("importedModelArn")
    _track(manifest, request, report, opts.tracking_uri, log)
    return report


def _track(manifest: dict, request: dict, report: dict, tracking_uri: str | None, log) -> None:
    """The job request and outcome on the Novella's run; `exported_uri` becomes the S3 location."""
    source = manifest.get("source") or {}
    uri = tracking_uri or source.get("tracking_uri")
    if not (source.get("run_id") and uri):
        return
    from forge import track

    deployment = {k: v for k, v in report.items() if k != "request"}
    try:
        track.log_export(uri, source["run_id"], {JOB_REQUEST: request, "bedrock-deployment.json": deployment},
                         report["s3_uri"])
        log(f"tracking: job request logged on run {source['run_id']}; exported_uri = {report['s3_uri']}")
    except Exception as e:  # the deployment happened; only its record failed
        log(f"tracking: warning: not logged on {redact_uri(uri)}: {type(e).__name__}: {e}")
