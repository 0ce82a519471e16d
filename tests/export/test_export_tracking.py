"""The quickstart Novella (the quickstart recipe, shrunk) exported by folder, by registry URI and by
run id: validation and round trip pass, and MLflow records the export on the Novella's run."""
from __future__ import annotations

import json

import boto3
import mlflow
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from forge import cli
from forge.recipe import load_recipe
from forge_testing import REPO

pytestmark = pytest.mark.slow  # every test exports from one tracked `forge run` of the quickstart (a module fixture)

ROLE = "arn:aws:iam::123456789012:role/BedrockImport"
ARN = "arn:aws:bedrock:us-east-1:123456789012:model-import-job/quickstart01"
SHRINK = ["data.stories.generate.documents=400", "data.acme_facts.generate.documents=200",
          "stages[0].max_tokens=4096", "stages[1].max_tokens=4096", "stages[0].eval.every=0",
          "stages[1].eval.every=0"]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart") / "run"
    overrides = SHRINK + [f"output={out}"]
    assert cli.main(["run", str(REPO / "tests" / "stages" / "quickstart_reference.yaml"), *overrides]) == 0
    return load_recipe(REPO / "tests" / "stages" / "quickstart_reference.yaml", overrides)


def _client(recipe):
    mlflow.set_tracking_uri(recipe.tracking_uri)
    return mlflow.MlflowClient()


def test_export_from_registry_uri_logs_on_the_novella_run(quickstart, tmp_path, capsys):
    out = tmp_path / "bedrock"
    assert cli.main(["export", "models:/quickstart@champion", "--tracking-uri", quickstart.tracking_uri,
                     "--out", str(out), "--verify", "--role-arn", ROLE, "--s3-uri", "s3://forge-models/qs"]) == 0
    assert "verify: logits within bf16 precision" in capsys.readouterr().out
    manifest = json.loads((out / "forge-manifest.json").read_text())
    assert manifest["source"]["versions"] == ["quickstart/1"] and manifest["lineage"]["name"] == "quickstart"
    assert [s["name"] for s in manifest["lineage"]["stages"]] == ["foundation", "domain"]
    assert manifest["names"]["importedModelName"] == "quickstart"
    client = _client(quickstart)
    run_id = manifest["source"]["run_id"]
    artifacts = {a.path for a in client.list_artifacts(run_id, "export")}
    assert artifacts == {"export/forge-manifest.json", "export/bedrock-import-job.json"}
    assert client.get_run(run_id).data.tags["forge.exported_uri"] == out.resolve().as_uri()
    assert client.get_model_version("quickstart", "1").tags["exported_uri"] == out.resolve().as_uri()
    card = (out / "MODEL_CARD.md").read_text()
    assert "| domain | pretrain |" in card and "| acme_facts | yes |" in card


def test_export_from_novella_folder_and_run_id_find_the_same_run(quickstart, tmp_path):
    novella = f"{quickstart.output}/novella"
    assert cli.main(["export", novella, "--out", str(tmp_path / "a"), "--format", "hf"]) == 0
    by_folder = json.loads((tmp_path / "a/forge-manifest.json").read_text())
    run_id = by_folder["source"]["run_id"]
    assert run_id and by_folder["source"]["versions"] == ["quickstart/1"]  # found through recipe.resolved.yaml
    assert cli.main(["export", run_id, "--tracking-uri", quickstart.tracking_uri, "--out", str(tmp_path / "b"),
                     "--verify"]) == 0
    by_run = json.loads((tmp_path / "b/forge-manifest.json").read_text())
    assert by_run["source"]["run_id"] == run_id
    # both carry the same trained weights, whichever way they were found
    assert by_folder["files"]["model-00001-of-00001.safetensors"]["sha256"] == \
        by_run["files"]["model-00001-of-00001.safetensors"]["sha256"]


def test_deploy_records_the_s3_location(quickstart, tmp_path, monkeypatch):
    out = tmp_path / "e"
    assert cli.main(["export", f"{quickstart.output}/novella", "--out", str(out)]) == 0
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFORGETESTKEY0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    with mock_aws():
        session = boto3.Session(region_name="us-east-1")
        s3, bedrock = session.client("s3"), session.client("bedrock")
        s3.create_bucket(Bucket="forge-models")
        with Stubber(bedrock) as stub:
            stub.add_response("create_model_import_job", {"jobArn": ARN},
                              {"jobName": "qs-1", "importedModelName": "quickstart", "roleArn": ROLE,
                               "modelDataSource": {"s3DataSource": {"s3Uri": "s3://forge-models/qs/"}},
                               "jobTags": ANY, "importedModelTags": ANY})
            fake = type("S", (), {"client": lambda self, name: {"s3": s3, "bedrock": bedrock}[name]})()
            monkeypatch.setattr(boto3, "Session", lambda **kw: fake)
            assert cli.main(["deploy", str(out), "--s3-uri", "s3://forge-models/qs", "--role-arn", ROLE,
                             "--job-name", "qs-1", "--no-wait"]) == 0
    client = _client(quickstart)
    run_id = json.loads((out / "forge-manifest.json").read_text())["source"]["run_id"]
    assert client.get_model_version("quickstart", "1").tags["exported_uri"] == "s3://forge-models/qs/"
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="export/bedrock-deployment.json",
                                                dst_path=str(tmp_path / "dl"))
    assert json.loads(open(local).read())["job_arn"] == ARN
