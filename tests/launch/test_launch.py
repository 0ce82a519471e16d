"""forge launch: for each target, the job's layout (nodes, processes, chips, strategy) is the plan's,
and the `forge run` it starts plans the same chips on the same target; layouts no engine can run are
refused with one line before anything is written."""
import json
import shlex

import pytest
import yaml

from forge.cli import main
from forge.launch.slurm import parse as parse_sbatch
from forge.plan.recipe_plan import plan_recipe
from forge.plan.stacks import engine_data
from forge.recipe import load_recipe
from forge_testing import base_recipe, write_recipe


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launch")
    return write_recipe(tmp / "r.yaml", base_recipe(tmp))


def launch(recipe, out, engine, target, *extra) -> tuple[int, dict]:
    code = main(["launch", str(recipe), "--engine", engine, "--target", target, "--out", str(out), *extra])
    record = json.loads((out / "launch.json").read_text()) if (out / "launch.json").exists() else {}
    return code, record


def torchrun_words(line: str) -> tuple[dict, list[str]]:
    """(torchrun's options, the words after them: -m forge.cli run RECIPE OVERRIDES) of a command line."""
    words = shlex.split(line)
    words = words[words.index("torchrun") + 1:]
    cut = words.index("-m")
    opts, i = {}, 0
    while i < cut:
        if words[i] == "--standalone":
            opts["standalone"], i = True, i + 1
        else:
            opts[words[i]], i = words[i + 1], i + 2
    return opts, words[cut:]


def assert_same_layout(record: dict, nodes: int, per_node: int, run: list[str], recipe_path) -> None:
    """What the job launches is what the plan chose, and the job's own forge run plans it again."""
    chip = record["chip"]
    ranks = engine_data()["chips"][chip]["ranks_per_chip"]
    launched = record["launched"]
    chips = nodes * per_node // ranks
    for plan in record["plans"]:
        d = plan["layout_detail"]
        assert plan["chips"] == chips == launched["chips"]
        assert (d["tp"], d["pp"], d["cp"], d["dp"]) == (1, 1, 1, chips)
        assert {0: "ddp", 3: "fsdp"}[d["zero"]] == record["strategy"]
    assert (launched["nodes"], launched["processes_per_node"]) == (nodes, per_node)
    assert run[:3] == ["-m", "forge.cli", "run"]
    overrides = run[4:]
    assert f"compute.chips={chips}" in overrides and f"compute.target={record['target']}" in overrides
    assert f"parallelism.strategy={record['strategy']}" in overrides
    job = load_recipe(str(recipe_path), [o for o in overrides if o.split("=")[0].startswith(("compute", "parallelism"))])
    again = plan_recipe(job)
    assert {(p.target, p.chips) for p in again} == {(record["target"], chips)}


@pytest.mark.parametrize("target, nodes, want_nodes, want_per_node", [
    ("h100:16", None, 2, 8), ("p5.48xlarge", "2", 2, 8), ("b200", None, 1, 8), ("trn2", None, 4, 64),
    ("trn2.48xlarge", "2", 2, 64), ("trn3", None, 36, 16), ("local", None, 1, 1)])
def test_torchrun_launches_the_planned_layout(recipe, tmp_path, target, nodes, want_nodes, want_per_node):
    code, record = launch(recipe, tmp_path, "torchrun", target, *(["--nodes", nodes] if nodes else []))
    assert code == 0
    line = next(x for x in (tmp_path / "torchrun.sh").read_text().splitlines() if x.startswith("exec torchrun"))
    opts, run = torchrun_words(line)
    assert (int(opts["--nnodes"]), int(opts["--nproc-per-node"])) == (want_nodes, want_per_node)
    assert ("standalone" in opts) == (want_nodes == 1) and ("--rdzv-endpoint" in opts) == (want_nodes > 1)
    assert_same_layout(record, want_nodes, want_per_node, run, recipe)
    accel = (tmp_path / "accelerate.yaml").read_text()
    assert f"num_machines: {want_nodes}\n" in accel and f"num_processes: {want_nodes * want_per_node}\n" in accel


def test_the_accelerate_config_is_one_accelerate_reads(recipe, tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig

    assert launch(recipe, tmp_path, "torchrun", "h100:16")[0] == 0
    config = ClusterConfig.from_yaml_file(str(tmp_path / "accelerate.yaml"))
    kind = getattr(config.distributed_type, "value", config.distributed_type)
    assert (config.num_machines, config.num_processes, kind) == (2, 16, "MULTI_GPU")


@pytest.mark.parametrize("target, nodes, gpus", [("p5.48xlarge", "4", 8), ("trn2", None, None)])
def test_slurm_script_runs_the_planned_layout(recipe, tmp_path, target, nodes, gpus):
    import subprocess

    code, record = launch(recipe, tmp_path, "slurm", target, *(["--nodes", nodes] if nodes else []))
    assert code == 0
    script = tmp_path / "forge.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    got = parse_sbatch(script.read_text())
    assert got.get("gpus_per_node") == gpus
    assert_same_layout(record, got["nodes"], got["nproc_per_node"], got["args"], recipe)


@pytest.mark.parametrize("args, says", [
    (["--target", "h100:16", "--nodes", "1"], "more processes than 1 node(s) of p5.48xlarge (8 x H100) have chips"),
    (["--target", "h100:12"], "leaves part nodes"),
    (["--target", "p5.48xlarge:8", "--nodes", "2"], "leaves part nodes"),
    (["--target", "trn1"], "TorchNeuron (forge's Trainium path) runs on Trn2 and Trn3 only"),
    (["--target", "trn3,h100"], "forge launch runs on one target"),
    (["--target", "nosuch"], "unknown target 'nosuch'"),
])
def test_a_layout_no_engine_can_run_is_refused_before_anything_is_written(recipe, tmp_path, capsys, args, says):
    out = tmp_path / "job"
    assert main(["launch", str(recipe), "--engine", "slurm", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and err[-1].startswith("forge: error:")
    assert not out.exists()


def test_a_model_that_needs_model_parallelism_is_refused(tmp_path, capsys):
    big = {"scratch": {"hidden_size": 8192, "layers": 80, "heads": 64, "kv_heads": 8, "vocab_size": 128256,
                       "max_position": 4096, "intermediate_size": 28672, "tokenizer_sources": ["general"]}}
    r = base_recipe(tmp_path, base=big)
    r["stages"][0].update(seq_len=4096, batch_size=1)
    path = write_recipe(tmp_path / "big.yaml", r)
    assert main(["launch", str(path), "--engine", "torchrun", "--target", "h100:8", "--out", str(tmp_path / "j")]) == 2
    assert "stage 'cpt' cannot run data parallel" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()


def test_slurm_and_kubernetes_refuse_this_machine(recipe, tmp_path, capsys):
    assert launch(recipe, tmp_path / "j", "slurm", "local")[0] == 2
    assert "--target local is this machine" in capsys.readouterr().err


def test_the_recipe_strategy_is_kept_and_the_stack_forge_runs_is_named(recipe, tmp_path):
    code, record = launch(recipe, tmp_path / "a", "torchrun", "trn2")
    # trn2's default stack is the one forge launch runs: no substitution to report
    assert code == 0 and record["stack"] == "torchneuron" and record["backend"] == "neuron"
    assert not any("forge does not run" in n for n in record["notes"])
    asked = yaml.safe_load(recipe.read_text())
    asked.setdefault("compute", {})["stack"] = "neuron"
    nxd = recipe.with_name("nxd.yaml")
    nxd.write_text(yaml.safe_dump(asked))
    code, record = launch(nxd, tmp_path / "b", "torchrun", "trn2")
    assert code == 0 and record["stack"] == "torchneuron"
    assert any("forge does not run the neuron stack" in n for n in record["notes"])


def test_a_plan_on_a_stack_forge_does_not_run_says_so(capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--tokens", "1B", "--target", "h100:8"]
    assert main([*args, "--stack", "megatron"]) == 0
    assert "forge does not run the megatron stack; `forge launch` runs fsdp (plan it with --stack fsdp)" in \
        capsys.readouterr().out
    assert main([*args, "--stack", "fsdp"]) == 0
    assert "forge does not run" not in capsys.readouterr().out
