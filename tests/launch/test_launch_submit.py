"""forge launch --engine sagemaker against a moto server on 127.0.0.1: an S3 data source is a
channel of its own (nothing copied through this machine), a locally registered catalog:// base
is the `base` channel, a source or base the job could not reach is refused before anything is
uploaded, every file is streamed to S3 (multipart above the part size), and no credentials or a
missing bucket is one line."""
from __future__ import annotations

import json
import urllib.request

import pytest

from forge import catalog
from forge.cli import main
from forge_testing import base_recipe, write_recipe

ROLE = "arn:aws:iam::123456789012:role/forge-sm"
SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzzzSECRET"
ML = "/opt/ml/input/data"


@pytest.fixture
def aws(monkeypatch):
    """A moto server (S3 and SageMaker) as every boto3 client's endpoint, with bucket forge-bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its state in this process across servers: start from none
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"), timeout=30)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")  # only ever this local server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFORGETESTKEY0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-west-2")
    for bucket in ("forge-bucket", "data-bucket"):
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    sm = boto3.client("sagemaker", endpoint_url=f"http://{host}:{port}", region_name="us-west-2")
    yield s3, sm
    server.stop()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))


def launch(recipe, out, *extra, s3="s3://forge-bucket/acme") -> int:
    return main(["launch", str(recipe), "--engine", "sagemaker", "--target", "p5.48xlarge", "--out", str(out),
                 "--s3", s3, "--role-arn", ROLE, "--region", "us-west-2", "--job-name", "acme-1", *extra])


def keys(s3, bucket="forge-bucket") -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def channels(out) -> dict[str, str]:
    req = json.loads((out / "create-training-job.json").read_text())
    return {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in req["InputDataConfig"]}


def run_words(out) -> list[str]:
    import shlex

    line = next(x for x in (out / "forge-launch.sh").read_text().splitlines() if x.startswith("exec torchrun"))
    return shlex.split(line)


@pytest.mark.parametrize("path, uri, in_job", [
    ("s3://data-bucket/crm/2024/*.jsonl", "s3://data-bucket/crm/2024/", f"{ML}/data-crm/*.jsonl"),
    ("s3://data-bucket/crm/20*/a.jsonl", "s3://data-bucket/crm/", f"{ML}/data-crm/20*/a.jsonl"),
    ("s3://data-bucket/crm", "s3://data-bucket/crm/", f"{ML}/data-crm"),
    ("s3://data-bucket/crm/", "s3://data-bucket/crm/", f"{ML}/data-crm"),
    ("s3://data-bucket/crm/2024/a.jsonl", "s3://data-bucket/crm/2024/a.jsonl", f"{ML}/data-crm/a.jsonl")])
def test_an_s3_source_is_a_channel_of_its_own(tmp_path, path, uri, in_job):
    r = base_recipe(tmp_path)
    r["data"]["crm"] = {"path": path, "proprietary": True}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    assert launch(recipe, tmp_path / "job") == 0
    assert channels(tmp_path / "job")["data-crm"] == uri
    assert f"data.crm.path={in_job}" in run_words(tmp_path / "job")


def test_submit_sends_no_copy_of_an_s3_source_and_the_job_reads_it(aws, tmp_path):
    s3, sm = aws
    s3.put_object(Bucket="data-bucket", Key="crm/2024/a.jsonl", Body=b'{"text": "one"}\n')
    r = base_recipe(tmp_path)
    r["data"]["crm"] = {"path": "s3://data-bucket/crm/2024/*.jsonl", "proprietary": True}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    assert launch(recipe, tmp_path / "job", "--submit") == 0
    assert keys(s3) == ["acme/code/forge-launch.sh", "acme/code/forge-src.tar.gz", "acme/recipe/r.yaml"]
    job = sm.describe_training_job(TrainingJobName="acme-1")
    got = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job["InputDataConfig"]}
    assert got["data-crm"] == "s3://data-bucket/crm/2024/"


def test_a_registered_catalog_base_is_the_base_channel(aws, home, tiny_checkpoint, tmp_path):
    s3, sm = aws
    catalog.add("acme@mid-trained", tiny_checkpoint)
    r = base_recipe(tmp_path, base="catalog://acme@mid-trained")
    r["data"] = {"general": {"generate": {"kind": "stories", "documents": 50, "seed": 0}}}
    r["stages"][0]["mixture"] = {"general": 1.0}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    assert launch(recipe, tmp_path / "job", "--submit") == 0
    assert channels(tmp_path / "job")["base"] == "s3://forge-bucket/acme/base/"
    assert f"base={ML}/base/{tiny_checkpoint.name}" in run_words(tmp_path / "job")
    sent = [k for k in keys(s3) if k.startswith("acme/base/")]
    want = sorted(f"acme/base/{tiny_checkpoint.name}/{p.relative_to(tiny_checkpoint).as_posix()}"
                  for p in tiny_checkpoint.rglob("*") if p.is_file())
    assert sent == want
    assert sm.describe_training_job(TrainingJobName="acme-1")["TrainingJobName"] == "acme-1"


@pytest.mark.parametrize("case, says", [
    ("gcs", "data.crm.path 'gs://data-bucket/crm/a.jsonl': a SageMaker job reads S3 channels only"),
    ("empty-s3", "data.crm.path 's3://data-bucket/nothing/': no objects there"),
    ("gone-base", "catalog://acme@mid-trained"),
])
def test_a_source_or_base_the_job_cannot_reach_is_refused_before_any_upload(aws, home, tiny_checkpoint, tmp_path,
                                                                           capsys, case, says):
    import shutil

    s3, sm = aws
    r = base_recipe(tmp_path)
    if case == "gcs":
        r["data"]["crm"] = {"path": "gs://data-bucket/crm/a.jsonl", "proprietary": True}
    if case == "empty-s3":
        r["data"]["crm"] = {"path": "s3://data-bucket/nothing/", "proprietary": True}
    if case == "gone-base":
        copy = tmp_path / "ckpt"
        shutil.copytree(tiny_checkpoint, copy)
        catalog.add("acme@mid-trained", copy)
        r["base"] = "catalog://acme@mid-trained"
        r["data"] = {"general": {"generate": {"kind": "stories", "documents": 50, "seed": 0}}}
        r["stages"][0]["mixture"] = {"general": 1.0}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    if case == "gone-base":
        shutil.rmtree(copy)
    assert launch(recipe, tmp_path / "job", "--submit") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("forge: error:") and says in err[-1], err
    assert keys(s3) == []
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_submit_streams_a_file_larger_than_the_part_size_in_parts(aws, tmp_path):
    s3, sm = aws
    big = tmp_path / "big.txt"
    line = b"The capital of Freedonia is Fredville, on the river Fred.\n"
    with big.open("wb") as f:
        for _ in range((6 * 1024**2) // len(line) + 1):
            f.write(line)
    r = base_recipe(tmp_path)
    r["data"]["domain"] = {"path": "big.txt", "proprietary": True}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    assert launch(recipe, tmp_path / "job", "--submit", "--part-size-mb", "5") == 0
    head = s3.head_object(Bucket="forge-bucket", Key="acme/data-domain/big.txt")
    assert head["ContentLength"] == big.stat().st_size and head["ETag"].strip('"').endswith("-2")  # two parts
    body = s3.get_object(Bucket="forge-bucket", Key="acme/data-domain/big.txt")["Body"].read()
    assert body == big.read_bytes()
    assert sm.describe_training_job(TrainingJobName="acme-1")["TrainingJobStatus"]


def test_submit_without_credentials_is_one_line(aws, tmp_path, monkeypatch, capsys):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    recipe = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    assert launch(recipe, tmp_path / "job", "--submit") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("forge: error: no AWS credentials found"), err


def test_submit_to_a_missing_bucket_is_one_line_and_never_shows_the_credentials(aws, tmp_path, capsys):
    s3, sm = aws
    recipe = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    assert launch(recipe, tmp_path / "job", "--submit", s3="s3://no-such-bucket/acme") == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert err[-1].startswith("forge: error: --s3 s3://no-such-bucket/acme: no such bucket"), err
    assert SECRET not in out.out + out.err and "AKIAFORGETESTKEY0000" not in out.out + out.err
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_only_submit_sends_and_then_every_channel_before_the_job(aws, tmp_path, capsys):
    s3, sm = aws
    (tmp_path / "kb.txt").write_text("The capital of Freedonia is Fredville.\n")
    r = base_recipe(tmp_path)
    r["data"]["domain"] = {"path": "kb.txt", "proprietary": True}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    assert launch(recipe, tmp_path / "job") == 0
    assert keys(s3) == [] and sm.list_training_jobs()["TrainingJobSummaries"] == []  # no --submit: nothing sent
    assert launch(recipe, tmp_path / "job", "--submit") == 0
    assert keys(s3) == ["acme/code/forge-launch.sh", "acme/code/forge-src.tar.gz", "acme/data-domain/kb.txt",
                        "acme/recipe/r.yaml"]
    sent = s3.get_object(Bucket="forge-bucket", Key="acme/code/forge-launch.sh")["Body"].read()
    assert sent == (tmp_path / "job" / "forge-launch.sh").read_bytes()
    out = capsys.readouterr()
    assert "started arn:aws:sagemaker:us-west-2:" in out.out and out.out.rstrip().endswith("training-job/acme-1")
    assert SECRET not in out.out + out.err and "AKIAFORGETESTKEY0000" not in out.out + out.err
