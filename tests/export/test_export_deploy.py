"""forge deploy: S3 upload on moto (multipart, resumable), the import job through botocore's
Stubber (which checks every request and response against the real service model)."""
from __future__ import annotations

import json
import os

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from export_fixtures import save_tiny
from forge import cli
from forge.errors import ForgeError
from forge.export.deploy import DeployOptions, deploy, upload
from forge.export.layout import ExportOptions, export
from forge.export.source import resolve

ROLE = "arn:aws:iam::123456789012:role/BedrockImport"
ARN = "arn:aws:bedrock:us-east-1:123456789012:model-import-job/abc123xyz789"
MODEL_ARN = "arn:aws:bedrock:us-east-1:123456789012:imported-model/abc123xyz789"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYforgeLEAKTEST"


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy")
    src = save_tiny("llama", tmp / "llama", tiny_checkpoint)
    out = tmp / "export"
    export(resolve(str(src), None, tmp), out, ExportOptions(model_name="tiny-llama", max_shard_bytes=30_000),
           log=lambda *_: None)
    return out


@pytest.fixture
def aws(monkeypatch):
    """moto's S3 and a Stubber-backed Bedrock client, behind one session-like object."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFORGETESTKEY0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        session = boto3.Session(region_name="us-east-1")
        s3 = session.client("s3")
        s3.create_bucket(Bucket="forge-models")
        bedrock = session.client("bedrock")
        with Stubber(bedrock) as stub:
            yield type("Aws", (), {"s3": s3, "bedrock": bedrock, "stub": stub,
                                   "client": lambda self, name: {"s3": s3, "bedrock": bedrock}[name]})()


def _job(status, **extra):
    return {"jobArn": ARN, "jobName": "job-1", "importedModelName": "tiny-llama", "roleArn": ROLE,
            "modelDataSource": {"s3DataSource": {"s3Uri": "s3://forge-models/novellas/tiny/"}}, "status": status,
            "creationTime": "2026-01-01T00:00:00Z", **extra}


def _expect_job(aws, final: dict):
    aws.stub.add_response("create_model_import_job", {"jobArn": ARN}, expected_params={
        "jobName": "job-1", "importedModelName": "tiny-llama", "roleArn": ROLE,
        "modelDataSource": {"s3DataSource": {"s3Uri": "s3://forge-models/novellas/tiny/"}},
        "jobTags": ANY, "importedModelTags": ANY})
    aws.stub.add_response("get_model_import_job", _job("InProgress"), {"jobIdentifier": ARN})
    aws.stub.add_response("get_model_import_job", final, {"jobIdentifier": ARN})


def test_deploy_uploads_then_imports(exported, aws):
    _expect_job(aws, _job("Completed", importedModelArn=MODEL_ARN))
    report = deploy(exported, "s3://forge-models/novellas/tiny", ROLE, DeployOptions(job_name="job-1", poll_seconds=0),
                    session=aws, log=lambda *_: None)
    aws.stub.assert_no_pending_responses()
    assert report["status"] == "Completed" and report["imported_model_arn"] == MODEL_ARN
    manifest = json.loads((exported / "forge-manifest.json").read_text())
    listed = aws.s3.list_objects_v2(Bucket="forge-models", Prefix="novellas/tiny/")["Contents"]
    assert {o["Key"].removeprefix("novellas/tiny/") for o in listed} == set(manifest["files"]) | {"forge-manifest.json"}
    for name, entry in manifest["files"].items():
        obj = aws.s3.get_object(Bucket="forge-models", Key=f"novellas/tiny/{name}")
        assert obj["Body"].read() == (exported / name).read_bytes()
        assert obj["Metadata"]["sha256"] == entry["sha256"]
    request = json.loads((exported / "bedrock-import-job.json").read_text())
    assert request["modelDataSource"]["s3DataSource"]["s3Uri"] == "s3://forge-models/novellas/tiny/"


def test_failed_job_reports_bedrock_message(exported, aws, monkeypatch, capsys):
    _expect_job(aws, _job("Failed", failureMessage="The model architecture is not supported."))
    monkeypatch.setattr(boto3, "Session", lambda **kw: aws)
    code = cli.main(["deploy", str(exported), "--s3-uri", "s3://forge-models/novellas/tiny/", "--role-arn", ROLE,
                     "--job-name", "job-1", "--poll-seconds", "0"])
    first, err = capsys.readouterr().err.split("\n", 1)  # the command's first line, then the refusal
    assert code == 2 and first.startswith(f"forge deploy {exported} -> ")
    assert err.strip() == "forge: error: import job job-1 failed: The model architecture is not supported."


def test_resumed_upload_skips_unchanged_files(exported, aws):
    manifest = json.loads((exported / "forge-manifest.json").read_text())
    first = upload(exported, aws.s3, "forge-models", "run/", manifest, log=lambda *_: None)
    assert first["skipped"] == [] and len(first["uploaded"]) == len(manifest["files"]) + 1
    shard = sorted(n for n in manifest["files"] if n.startswith("model-"))[0]
    aws.s3.delete_object(Bucket="forge-models", Key=f"run/{shard}")           # an interrupted upload
    aws.s3.put_object(Bucket="forge-models", Key="run/config.json", Body=b"{}",  # a stale object
                      Metadata={"sha256": "0" * 64})
    second = upload(exported, aws.s3, "forge-models", "run/", manifest, log=lambda *_: None)
    assert sorted(second["uploaded"]) == sorted([shard, "config.json"])
    assert len(second["skipped"]) == len(first["uploaded"]) - 2
    third = upload(exported, aws.s3, "forge-models", "run/", manifest, log=lambda *_: None)
    assert third["uploaded"] == []


def test_large_files_go_multipart(tmp_path, aws):
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "model-00001-of-00001.safetensors").write_bytes(os.urandom(11 * 1024 * 1024))
    from forge.export.layout import sha256

    files = {"model-00001-of-00001.safetensors": {"sha256": sha256(folder / "model-00001-of-00001.safetensors"),
                                                  "bytes": 11 * 1024 * 1024}}
    (folder / "forge-manifest.json").write_text(json.dumps({"format": "bedrock", "files": files}))
    upload(folder, aws.s3, "forge-models", "big/", {"files": files}, part_size=5 * 1024 * 1024, log=lambda *_: None)
    head = aws.s3.head_object(Bucket="forge-models", Key="big/model-00001-of-00001.safetensors")
    assert head["ETag"].strip('"').endswith("-3")  # three parts of at most 5 MiB
    with pytest.raises(ForgeError, match="at least 5"):
        upload(folder, aws.s3, "forge-models", "big/", {"files": files}, part_size=1024)


def test_changed_file_is_not_uploaded(exported, aws, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    (copy / "config.json").write_text("{}")
    with pytest.raises(ForgeError, match="config.json: missing or changed since export"):
        deploy(copy, "s3://forge-models/x", ROLE, DeployOptions(job_name="job-1"), session=aws, log=lambda *_: None)


def test_dry_run_sends_nothing(exported, monkeypatch, capsys):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(boto3, "Session", lambda **kw: pytest.fail("a dry run must not reach AWS"))
    assert cli.main(["deploy", str(exported), "--s3-uri", "s3://forge-models/dry", "--role-arn", ROLE,
                     "--dry-run"]) == 0
    assert "nothing sent" in capsys.readouterr().out
    request = json.loads((exported / "bedrock-import-job.json").read_text())
    assert request["roleArn"] == ROLE and request["modelDataSource"]["s3DataSource"]["s3Uri"] == "s3://forge-models/dry/"


def test_bad_role_and_missing_credentials_are_one_line_errors(exported, tmp_path, monkeypatch, capsys):
    code = cli.main(["deploy", str(exported), "--s3-uri", "s3://forge-models/x", "--role-arn", "admin"])
    first, err = capsys.readouterr().err.split("\n", 1)  # the command's first line, then the refusal
    assert code == 2 and first.startswith("forge deploy ")
    assert "roleArn 'admin' does not match" in err and err.count("\n") == 1
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code = cli.main(["deploy", str(exported), "--s3-uri", "s3://forge-models/x", "--role-arn", ROLE,
                     "--region", "us-east-1"])
    first, err = capsys.readouterr().err.split("\n", 1)
    assert code == 2 and first.startswith("forge deploy ")
    assert err.startswith("forge: error: no AWS credentials found") and err.count("\n") == 1


def test_credentials_are_never_logged(exported, aws, monkeypatch, capsys):
    _expect_job(aws, _job("Completed", importedModelArn=MODEL_ARN))
    monkeypatch.setattr(boto3, "Session", lambda **kw: aws)
    assert cli.main(["deploy", str(exported), "--s3-uri", "s3://forge-models/novellas/tiny", "--role-arn", ROLE,
                     "--job-name", "job-1", "--poll-seconds", "0"]) == 0
    captured = capsys.readouterr()
    assert "import job job-1: Completed" in captured.out
    for text in (captured.out, captured.err, *(p.read_text(errors="replace") for p in exported.iterdir())):
        assert SECRET not in text and "AKIAFORGETESTKEY0000" not in text
