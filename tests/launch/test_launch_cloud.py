"""forge launch on Kubernetes and SageMaker: the PyTorchJob conforms to the Kubeflow CRD schema and
launches the planned layout; the CreateTrainingJob request passes botocore's model, carries the
recipe, its data and forge's source as channels (submitting it: test_launch_submit.py, on moto)."""
import json

import pytest
import yaml

from forge.cli import main
from forge.launch import kubernetes, sagemaker
from forge.launch.layout import plan_launch
from forge.recipe import load_recipe
from forge_testing import base_recipe, write_recipe
from test_launch import assert_same_layout, torchrun_words

S3, ROLE = "s3://forge-bucket/acme", "arn:aws:iam::123456789012:role/forge-sm"


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cloud")
    (tmp / "kb.txt").write_text("The capital of Freedonia is Fredville.\n\nIts river is the Fred.\n")
    r = base_recipe(tmp)
    r["data"]["domain"] = {"path": "kb.txt", "proprietary": True}
    return write_recipe(tmp / "r.yaml", r)


@pytest.mark.parametrize("target, nodes, per_node, resource, devices", [
    ("trn2", 4, 64, "aws.amazon.com/neuron", 16), ("h100:32", 4, 8, "nvidia.com/gpu", 8),
    ("h100:4", 1, 4, "nvidia.com/gpu", 4)])
def test_pytorchjob_conforms_to_the_crd_and_runs_the_planned_layout(recipe, tmp_path, target, nodes, per_node, resource,
                                                                   devices):
    assert main(["launch", str(recipe), "--engine", "kubernetes", "--target", target, "--out", str(tmp_path)]) == 0
    doc = yaml.safe_load((tmp_path / "pytorchjob.yaml").read_text())
    assert kubernetes.problems(doc) == []
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert sum(s["replicas"] for s in specs.values()) == nodes and specs["Master"]["replicas"] == 1
    assert doc["spec"]["nprocPerNode"] == str(per_node)
    container = specs["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["resources"]["limits"][resource] == devices
    opts, run = torchrun_words(" ".join(["torchrun", *container["args"]]))
    assert int(opts["--nnodes"]) == nodes and int(opts["--nproc-per-node"]) == per_node
    record = json.loads((tmp_path / "launch.json").read_text())
    assert_same_layout(record, nodes, per_node, run, recipe)


def test_the_crd_schema_names_what_a_manifest_gets_wrong(recipe):
    launch = plan_launch(str(recipe), "h100:16")
    doc = kubernetes.manifest(launch, "img", "/w", "claim", "nvidia.com/gpu")
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "one"
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["argz"] = []
    del doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"]
    got = "\n".join(kubernetes.problems(doc))
    assert "spec.pytorchReplicaSpecs.Worker.replicas: 'one' is not of type 'integer'" in got
    assert "'argz' was unexpected" in got and "'name' is a required property" in got
    assert "kubeflow/training-operator" in json.loads(kubernetes.SCHEMA_FILE.read_text())["cite"]


def opts(**kw):
    return sagemaker.Options(**{"s3": S3, "role_arn": ROLE, "region": "us-west-2", "job_name": "acme-1", **kw})


@pytest.mark.parametrize("target, nodes, instance, image", [
    ("trn2.48xlarge:32", 2, "ml.trn2.48xlarge", "pytorch-training-neuronx"),
    ("p5.48xlarge:16", 2, "ml.p5.48xlarge", "pytorch-training:2.8.0-gpu")])
def test_sagemaker_request_passes_botocore_and_launches_the_plan(recipe, tmp_path, target, nodes, instance, image):
    args = ["launch", str(recipe), "--engine", "sagemaker", "--target", target, "--out", str(tmp_path), "--s3", S3,
            "--role-arn", ROLE, "--region", "us-west-2", "--job-name", "acme-1"]
    assert main(args) == 0
    req = json.loads((tmp_path / "create-training-job.json").read_text())
    assert sagemaker.problems(req) == []
    assert req["ResourceConfig"]["InstanceType"] == instance and req["ResourceConfig"]["InstanceCount"] == nodes
    assert image in req["AlgorithmSpecification"]["TrainingImage"] and ".us-west-2." in req["AlgorithmSpecification"][
        "TrainingImage"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in req["InputDataConfig"]}
    assert channels == {"recipe": f"{S3}/recipe/", "code": f"{S3}/code/", "data-domain": f"{S3}/data-domain/"}
    line = next(x for x in (tmp_path / "forge-launch.sh").read_text().splitlines() if x.startswith("exec torchrun"))
    o, run = torchrun_words(line)
    assert int(o["--nnodes"]) == nodes
    assert run[3] == "/opt/ml/input/data/recipe/r.yaml"
    assert "data.domain.path=/opt/ml/input/data/data-domain/kb.txt" in run and "output=/opt/ml/checkpoints/tiny" in run
    assert_same_layout(json.loads((tmp_path / "launch.json").read_text()), nodes, int(o["--nproc-per-node"]),
                       run, recipe)


def test_botocore_shape_problems_are_named(recipe):
    launch = plan_launch(str(recipe), "p5.48xlarge")
    req, _ = sagemaker.request(launch, load_recipe(str(recipe)), opts())
    bad = json.loads(json.dumps(req))
    del bad["RoleArn"]
    bad["ResourceConfig"]["InstanceType"] = "ml.trn9.huge"
    bad["StoppingCondition"]["MaxRuntimeInSeconds"] = 0
    bad["AlgorithmSpecification"]["ContainerEntrypoint"] = ["x" * 300]
    bad["Colour"] = "blue"
    got = "\n".join(sagemaker.problems(bad))
    for says in ("RoleArn: required", "ResourceConfig.InstanceType: 'ml.trn9.huge' is not one of",
                 "StoppingCondition.MaxRuntimeInSeconds: 0 is below the minimum 1",
                 "AlgorithmSpecification.ContainerEntrypoint[0]: 300 characters is above the maximum 256",
                 "Colour: not a member of CreateTrainingJobRequest"):
        assert says in got, got


def test_trn3_has_no_sagemaker_instance_type_yet_and_says_so(recipe, tmp_path, capsys):
    args = ["launch", str(recipe), "--engine", "sagemaker", "--target", "trn3", "--out", str(tmp_path / "j"),
            "--s3", S3, "--role-arn", ROLE]
    assert main(args) == 2
    assert "no SageMaker training instance type is known for trn3-ultraserver" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()
    assert main([*args[:-4], "--role-arn", ROLE]) == 2
    assert "--engine sagemaker needs --s3" in capsys.readouterr().err


def test_submit_is_for_sagemaker_only(recipe, tmp_path, capsys):
    assert main(["launch", str(recipe), "--engine", "slurm", "--target", "h100", "--out", str(tmp_path / "j"),
                 "--submit"]) == 2
    assert "--submit starts sagemaker jobs" in capsys.readouterr().err and not (tmp_path / "j").exists()
