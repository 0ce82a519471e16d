"""forge launch: a name reaches a generated script as one quoted word and runs nothing; a newline in
a name leaves every script `bash -n` clean and every YAML file parsing to the document forge
meant; Kubernetes image and volume-claim names are refused unless Kubernetes would take them."""
import json

import pytest
import yaml

from forge.cli import main
from forge.launch import kubernetes, torchrun
from forge.launch.layout import plan_launch
from forge_testing import base_recipe, write_recipe
from launch_scripts import bash_n, run_script

S3, ROLE = "s3://forge-bucket/acme", "arn:aws:iam::123456789012:role/forge-sm"
SAGEMAKER = ["--s3", S3, "--role-arn", ROLE, "--job-name", "acme-1"]
INJECT = "r$(touch X)`touch Y`${PATH:+Z}"
NEWLINES = "r\ntouch X\n: x\n- y ( #.yaml"  # a command, a YAML key and a bash syntax error


def recipe_at(tmp_path, name: str, data_file: str | None = None):
    folder = tmp_path / "in"
    folder.mkdir()
    r = base_recipe(folder)
    if data_file is not None:
        (folder / data_file).write_text("The capital of Freedonia is Fredville.\n")
        r["data"]["domain"] = {"path": data_file, "proprietary": True}
    return write_recipe(folder / name, r)


def words_after_torchrun(words: list[str]) -> list[str]:
    return words[words.index("-m"):]


@pytest.mark.parametrize("engine, script, target, extra", [
    ("torchrun", "torchrun.sh", "local", []), ("torchrun", "torchrun.sh", "h100:16", []),
    ("slurm", "forge.sbatch", "p5.48xlarge", ["--nodes", "2"]),
    ("sagemaker", "forge-launch.sh", "p5.48xlarge", SAGEMAKER)])
def test_a_recipe_file_name_runs_nothing_when_the_script_runs(tmp_path, engine, script, target, extra):
    recipe = recipe_at(tmp_path, f"{INJECT}.yaml")
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", engine, "--target", target, "--out", str(out), *extra]) == 0
    text = (out / script).read_text()
    assert bash_n(text, tmp_path).returncode == 0
    got = words_after_torchrun(run_script(text, tmp_path, {"NODE_RANK": "1", "MASTER_ADDR": "$(touch W)"}))
    where = str(recipe) if engine != "sagemaker" else f"/opt/ml/input/data/recipe/{recipe.name}"
    assert got[:4] == ["-m", "forge.cli", "run", where]


def test_a_data_file_name_runs_nothing_in_the_sagemaker_entry_script(tmp_path):
    recipe = recipe_at(tmp_path, "r.yaml", data_file="d$(touch X).txt")
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", "sagemaker", "--target", "p5.48xlarge", "--out", str(out),
                 *SAGEMAKER]) == 0
    got = run_script((out / "forge-launch.sh").read_text(), tmp_path)
    assert "data.domain.path=/opt/ml/input/data/data-domain/d$(touch X).txt" in got


def test_torchrun_takes_the_node_rank_and_head_address_from_the_environment_verbatim(tmp_path):
    recipe = recipe_at(tmp_path, "r.yaml")
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", "torchrun", "--target", "h100:16", "--out", str(out)]) == 0
    got = run_script((out / "torchrun.sh").read_text(), tmp_path, {"NODE_RANK": "1", "MASTER_ADDR": "a b'$(touch V)"})
    assert got[got.index("--node-rank") + 1] == "1"
    assert got[got.index("--rdzv-endpoint") + 1] == "a b'$(touch V):29500"


@pytest.mark.parametrize("engine, target, extra", [
    ("torchrun", "h100:16", []), ("torchrun", "local", []), ("slurm", "trn2", []),
    ("kubernetes", "h100:16", []), ("sagemaker", "p5.48xlarge", SAGEMAKER)])
def test_a_newline_in_a_name_keeps_scripts_and_yaml_valid(tmp_path, engine, target, extra):
    recipe = recipe_at(tmp_path, NEWLINES, data_file="d\nx.txt" if engine == "sagemaker" else None)
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", engine, "--target", target, "--out", str(out), *extra]) == 0
    launch = plan_launch(str(recipe), target)
    for path in out.iterdir():
        if path.suffix in (".sh", ".sbatch"):
            assert bash_n(path.read_text(), tmp_path).returncode == 0, path.name
            got = run_script(path.read_text(), tmp_path)
            assert any(w.endswith(NEWLINES) for w in got), path.name
    if engine == "torchrun":
        assert yaml.safe_load((out / "accelerate.yaml").read_text()) == torchrun.accelerate_config(launch)
    if engine == "kubernetes":
        doc = yaml.safe_load((out / "pytorchjob.yaml").read_text())
        assert doc == kubernetes.manifest(launch, doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
                                          ["containers"][0]["image"], "/workspace", "forge-work", "nvidia.com/gpu")
    assert json.loads((out / "launch.json").read_text())["recipe"] == str(recipe)


@pytest.mark.parametrize("flag, value", [
    ("--image", "repo/forge:1\nevil: true"), ("--image", "Repo/Forge:1"), ("--image", "repo/forge:1 --privileged"),
    ("--image", ""), ("--volume-claim", "Forge_Work"), ("--volume-claim", "work\n"), ("--volume-claim", "a" * 254),
    ("--workdir", "relative/dir"), ("--workdir", "/w\nx")])
def test_kubernetes_names_are_refused_unless_kubernetes_takes_them(tmp_path, capsys, flag, value):
    recipe = recipe_at(tmp_path, "r.yaml")
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", "kubernetes", "--target", "h100:16", "--out", str(out),
                 flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"forge: error: {flag} ") and not out.exists()


def test_kubernetes_args_keep_a_dollar_paren_in_a_name_literal(tmp_path):
    """Kubernetes expands $(VAR) in container args; a name's own `$(` must reach torchrun as written."""
    recipe = recipe_at(tmp_path, "r$(RANK).yaml")
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", "kubernetes", "--target", "h100:16", "--out", str(out)]) == 0
    args = yaml.safe_load((out / "pytorchjob.yaml").read_text())["spec"]["pytorchReplicaSpecs"]["Master"][
        "template"]["spec"]["containers"][0]["args"]
    assert str(recipe).replace("$", "$$") in args and "$(RANK)" in args


@pytest.mark.parametrize("engine, named", [("torchrun", "recipe"), ("kubernetes", "recipe"), ("sagemaker", "recipe"),
                                           ("sagemaker", "data")])
def test_a_file_name_that_is_not_utf8_is_refused_in_one_line_with_nothing_written(tmp_path, capsys, engine, named):
    import os

    bad = os.fsdecode(b"x\xff.txt")
    recipe = recipe_at(tmp_path, bad + ".yaml") if named == "recipe" else recipe_at(tmp_path, "r.yaml", data_file=bad)
    out = tmp_path / "job"
    extra = SAGEMAKER if engine == "sagemaker" else []
    assert main(["launch", str(recipe), "--engine", engine, "--target", "h100:16", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("forge: error:") and "UTF-8" in err[-1], err
    assert not out.exists()
