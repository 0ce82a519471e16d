"""`forge plan` refuses bad input in one line; deadline+budget picks the cheapest plan in time;
a comparison marks a target that cannot run the workload and plans the rest; --model alone
describes the model; the catalog's units; stacks."""
import argparse
import json

import pytest

from forge import cli
from forge.errors import ForgeError
from forge.plan import command, workloads as W
from forge.plan.hardware import PACKAGE_CATALOG, get_system, load_catalog
from forge.plan.model import load_model_config
from forge.plan.planner import Goal, Setup, compare, plan_stage
from forge.plan.stacks import get_stack, known_stacks
from plan_fixtures import LLAMA_31_8B

BASE = ["plan", "--model", "llama-3.1-8b", "--tokens", "1B", "--target", "h100"]


@pytest.mark.parametrize("extra,message", [
    (["--seq-len", "0"], "--seq-len must be positive"),
    (["--seq-len", "-4096"], "--seq-len must be positive"),
    (["--steps", "0"], "--steps must be positive"),
    (["--steps", "-3"], "--steps must be positive"),
    (["--tokens", "0"], "--tokens must be positive"),
    (["--global-batch", "0"], "--global-batch must be positive"),
    (["--global-batch", "-8"], "--global-batch must be positive"),
    (["--chips", "0"], "--chips must be positive"),
    (["--chips", "-8"], "--chips must be positive"),
    (["--mfu", "0"], "--mfu must be positive"),
    (["--mfu", "-0.3"], "--mfu must be positive"),
    (["--mfu", "1.5"], "--mfu is a fraction of peak"),
    (["--deadline", "0"], "--deadline must be positive"),
    (["--deadline", "-5"], "--deadline must be positive"),
    (["--budget", "0"], "--budget must be positive"),
    (["--budget", "-100"], "--budget must be positive"),
    (["--target", ""], "--target is empty"),
    (["--target", " , "], "--target is empty"),
    (["--target", "h100:0"], "chip count must be positive"),
    (["--tokens", "1e22"], "chip-years"),
    (["--stack", "deepspeed-magic"], "known stacks: fsdp"),
])
def test_bad_input_is_refused_in_one_line(extra, message, capsys):
    assert cli.main(BASE + extra) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert message in err and "\n" not in err and err.startswith("forge: error:")
    assert "Traceback" not in err and captured.out == ""


def test_deadline_and_budget_pick_the_cheapest_plan_that_meets_the_deadline():
    cfg = load_model_config("llama-3.1-70b")
    wl = W.pretrain("cpt", 4096, 512, tokens=5e9)
    deadline_only = plan_stage(cfg, wl, "h100", Goal(deadline_h=200))
    both = plan_stage(cfg, wl, "h100", Goal(deadline_h=200, budget_usd=20_000))
    assert deadline_only.feasible and both.feasible and both.hours <= 200
    # the deadline alone takes the fewest chips; with a budget the cheapest plan in time wins
    assert both.chips > deadline_only.chips and both.cost_usd < deadline_only.cost_usd
    for n in (16, 24, 32, 48):
        other = plan_stage(cfg, wl, "h100", Goal(chips=n), band=False)
        if other.feasible and other.hours <= 200:
            assert both.cost_usd <= other.cost_usd * (1 + 1e-9)
    short = plan_stage(cfg, wl, "h100", Goal(deadline_h=200, budget_usd=5_000))
    assert not short.feasible and "cannot both be met" in short.reason and "cheapest plan that meets" in short.reason


def test_a_target_that_cannot_run_the_workload_is_marked_and_the_rest_planned(capsys):
    wl = W.pretrain("cpt", 4096, 256, tokens=1e9, precision="mxfp8")
    trn3, trn2 = compare(LLAMA_31_8B, wl, [("trn3", None), ("trn2", None)])
    assert trn3.feasible and trn3.hours > 0
    assert not trn2.feasible and "mxfp8" in trn2.reason and trn2.target == "trn2-ultraserver"
    rc = command.run(_args(["--model", "llama-3.1-8b", "--tokens", "1B", "--precision", "mxfp8",
                            "--target", "trn3,trn2"]))
    out = capsys.readouterr().out
    assert rc == 1 and "trn3-ultraserver" in out and "DOES NOT FIT" in out and "mxfp8" in out
    with pytest.raises(ForgeError, match="unknown target"):        # a typo is still an error
        compare(LLAMA_31_8B, wl, [("trn3", None), ("trn9", None)])


def _args(argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_model_alone_prints_exact_counts_and_memory(tmp_path, capsys):
    assert command.run(_args(["--model", "llama-3.1-8b"])) == 0
    out = capsys.readouterr().out
    assert "total 8,030,261,248" in out and "embedding 525,336,576" in out and "bf16" in out and "fp32" in out
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    assert command.run(_args(["--model", str(tmp_path), "--json"])) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["params_total"] == 8_030_261_248 and summary["params_active"] == 8_030_261_248
    assert summary["memory"]["bf16"]["weights_gb"] == pytest.approx(8_030_261_248 * 2 / 1e9)
    assert summary["memory"]["bf16"]["training_states_gb"] == pytest.approx(8_030_261_248 * 16 / 1e9)


def test_anchors_command_prints_the_replay(capsys):
    assert command.run(_args(["--anchors"])) == 0
    out = capsys.readouterr().out
    assert "llama3-405b-16k-gpus" in out and "nxd-llama3.1-70b-trn1" in out and "median ratio" in out


def test_catalog_units_are_decimal_gb_where_vendors_publish_gb():
    assert get_system("trn2").chip.hbm_bytes == 96e9
    assert get_system("trn3").chip.hbm_bytes == 144e9
    assert get_system("h100").chip.hbm_bytes == 80e9 and get_system("b200").chip.hbm_bytes == 180e9
    # AWS's totals are decimal: trn2.48xlarge 1.5 TB, Trn2 UltraServer 6 TB, Trn3 UltraServer 20.7 TB
    assert 16 * get_system("trn2.48xlarge").chip.hbm_bytes / 1e12 == pytest.approx(1.5, rel=0.03)
    assert 64 * get_system("trn2-ultraserver").chip.hbm_bytes / 1e12 == pytest.approx(6.0, rel=0.03)
    assert 144 * get_system("trn3").chip.hbm_bytes / 1e12 == pytest.approx(20.7, rel=0.01)
    # a user file may still give GiB
    import yaml
    raw = yaml.safe_load(PACKAGE_CATALOG.read_text())
    for key, chip in raw["chips"].items():
        assert ("hbm_gb" in chip) != ("hbm_gib" in chip), key
        assert all(0 < e <= 1 for e in chip["matmul_efficiency"].values()), key


def test_catalog_trainium_fixes_and_trn1():
    gen1, gen2 = get_system("trn3-gen1"), get_system("trn3")
    assert gen1.chips_per_instance == 16 and gen1.scale_up_chips == 64
    assert gen2.chip.link_GBps == gen2.scale_up_GBps == gen1.scale_up_GBps
    for name in ("trn1.32xlarge", "trn1n.32xlarge"):
        s = get_system(name)
        assert s.chip.key == "trainium1" and s.chips_per_instance == 16 and s.default_stack == "neuron"
        assert s.chip.peak_flops("bf16") == 190e12 and s.usd_per_chip_hour > 0
    assert get_system("trn1n").scale_out_GBps == 2 * get_system("trn1").scale_out_GBps


def test_every_target_has_a_known_default_stack_and_each_stack_says_where_it_comes_from():
    import yaml

    from forge.plan.stacks import STACKS_FILE
    catalog = load_catalog()
    for key in catalog["systems"]:
        get_stack(get_system(key, catalog).default_stack)
    raw = yaml.safe_load(STACKS_FILE.read_text())["stacks"]
    for name in known_stacks():
        assert raw[name]["source"] and raw[name]["fitted"], name
    with pytest.raises(ForgeError, match="known stacks"):
        get_stack("nope")


def test_stack_choice_changes_the_plan_and_is_recorded():
    cfg = load_model_config("llama-3.1-8b")
    wl = W.pretrain("cpt", 8192, 128, tokens=1e9)
    fsdp = plan_stage(cfg, wl, "h100", Goal(chips=8))
    mega = plan_stage(cfg, wl, "h100", Goal(chips=8), Setup(stack="megatron"))
    assert fsdp.stack == "fsdp" and mega.stack == "megatron"
    assert mega.step_time_s < fsdp.step_time_s                     # fused kernels, less non-matmul time
    nxd = plan_stage(cfg, wl, "h100", Goal(chips=8), Setup(stack="neuron"))
    assert "zero3" in fsdp.layout and "zero3" not in nxd.layout    # each stack's ZeRO options (NxD: 0, 1)
