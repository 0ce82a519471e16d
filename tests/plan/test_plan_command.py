"""`forge plan` end to end (without a recipe), the report outputs, and the recipe adapter."""
import argparse
import json
from types import SimpleNamespace

import pytest

from forge.errors import ForgeError
from forge.plan import command, workloads as W
from forge.plan.model import load_model_config
from forge.plan.planner import plan_stage
from forge.plan.recipe_plan import plan_recipe
from forge.plan.report import format_table, plan_tracking_payload, plot_plans, to_json
from plan_fixtures import LLAMA_31_8B, tiny_config


def _run(argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.run(parser.parse_args(argv))


def test_plan_from_a_config_dir_compares_targets(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    rc = _run(["--model", str(tmp_path), "--tokens", "100B", "--seq-len", "8192",
               "--target", "trn3-ultraserver,trn2-ultraserver,h100:64", "--plot", str(tmp_path / "c.png")])
    out = capsys.readouterr().out
    assert rc == 0
    for name in ("trn3-ultraserver", "trn2-ultraserver", "p5.48xlarge", "hours", "cost $", "kWh", "Btok/MWh"):
        assert name in out
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_output_and_exit_status_when_a_stage_does_not_fit(capsys):
    rc = _run(["--model", "llama-3.1-70b", "--tokens", "1B", "--seq-len", "4096", "--target", "local,h100",
               "--json"])
    plans = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [p["target"] for p in plans] == ["local", "p5.48xlarge"]
    assert not plans[0]["feasible"] and plans[0]["reason"]
    assert plans[1]["feasible"] and plans[1]["chips"] >= 16


def test_bad_target_and_missing_inputs_are_forge_errors(capsys):
    with pytest.raises(ForgeError, match="Known targets: local"):
        _run(["--model", "llama-3.1-8b", "--tokens", "1B", "--target", "tpu-v9"])
    with pytest.raises(ForgeError, match="needs a recipe"):
        _run([])
    from forge import cli

    assert cli.main(["plan", "--model", "llama-3.1-8b", "--tokens", "1B", "--target", "tpu-v9"]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_list_targets_and_calibrate(tmp_path, capsys):
    assert _run(["--list-targets"]) == 0
    assert "trn3-ultraserver" in capsys.readouterr().out
    from forge.plan.calibrate import predict_local_step, record_measurement
    cfg = tiny_config("llama").to_dict()
    for seq in (64, 256):
        pred = predict_local_step(cfg, seq, 2, 1, "fp32")
        record_measurement(tmp_path / f"seq{seq}", pred, {"step_time_s": pred["flops_per_step"] / 2e10,
                                                          "precision": "fp32", "flops_per_step": pred["flops_per_step"]})
    assert _run(["--calibrate", "--runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "calibrated local from 2 run(s): fp32: 0.02 TFLOP/s" in out and "used: seq256, seq64" in out
    cal = tmp_path / "calibration.yaml"
    assert cal.is_file()
    with pytest.raises(ForgeError, match="needs --runs"):
        _run(["--calibrate"])
    # applied only when asked: with --calibration the local step time is the calibrated one
    argv = ["--model", str(tmp_path / "cfg"), "--steps", "10", "--seq-len", "256", "--global-batch", "2",
            "--precision", "fp32", "--json"]
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(cfg))
    _run(argv)
    plain = json.loads(capsys.readouterr().out)[0]
    _run(argv + ["--calibration", str(cal)])
    calibrated = json.loads(capsys.readouterr().out)[0]
    assert calibrated["step_time_s"] == pytest.approx(pred["flops_per_step"] / 2e10, rel=1e-6)
    assert plain["step_time_s"] != pytest.approx(calibrated["step_time_s"], rel=0.01)


def test_parse_count():
    assert command.parse_count("100B") == 100e9
    assert command.parse_count("2.5M") == 2.5e6
    assert command.parse_count("1e9") == 1e9
    with pytest.raises(argparse.ArgumentTypeError):
        command.parse_count("lots")


def test_tracking_payload_table_and_json():
    plan = plan_stage(load_model_config("llama-3.1-8b"), W.pretrain("cpt", 8192, 512, tokens=1e10), "trn3")
    params, metrics, artifacts = plan_tracking_payload(plan)
    assert params["plan.chips"] == 144 and params["plan.layout"] == plan.layout
    assert metrics["plan.hours"] == plan.hours and metrics["plan.cost_usd"] == plan.cost_usd
    assert json.loads(artifacts["plan.json"])[0]["stage"] == "cpt"
    assert b"trn3-ultraserver" in artifacts["plan.txt"]
    assert json.loads(to_json([plan]))[0]["layout_detail"]["tp"] >= 1
    assert "Stage 'cpt' (pretrain)" in format_table([plan])


def test_plot_skips_plans_that_do_not_fit(tmp_path):
    cfg = load_model_config("llama-3.1-70b")
    wl = W.pretrain("cpt", 4096, 64, tokens=1e9)
    plans = [plan_stage(cfg, wl, "local"), plan_stage(cfg, wl, "h100")]
    path = plot_plans(plans, tmp_path / "sub" / "chart.png")
    assert path.stat().st_size > 1000


def test_plan_chart_reads_at_any_scale(tmp_path):
    from forge.plan.report import plan_figure

    cfg = load_model_config("llama-3.1-70b")
    wl = W.pretrain("cpt", 4096, 64, tokens=1e12)
    plans = [plan_stage(cfg, wl, t) for t in ("trn3-ultraserver", "trn2-ultraserver", "p5.48xlarge")]
    plans.append(plan_stage(cfg, W.pretrain("cpt", 4096, 64, tokens=1e6), "p5.48xlarge"))  # a tiny one beside
    fig = plan_figure(plans, measured_hours={"trn3-ultraserver": plans[0].hours * 1.2})
    time_ax, cost_ax = fig.axes[:2]
    assert [t.get_text() for t in time_ax.get_yticklabels()] == [p.target for p in plans]
    assert time_ax.get_xscale() == "log" and cost_ax.get_xscale() == "log"  # spans orders of magnitude
    texts = [t.get_text() for t in time_ax.texts]
    assert f"({plans[0].chips} chips, {plans[0].layout})" in texts[0]
    assert time_ax.get_legend().get_texts()[0].get_text() == "measured"
    same = plan_figure(plans[:1])
    assert same.axes[0].get_xscale() == "linear"


def test_plan_recipe_dispatches_on_typed_stage_settings(tmp_path):
    from forge.recipe import MidtrainStage, PretrainStage, SoupStage

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    common = {"seq_len": 8192, "batch_size": 4, "grad_accum": 2, "precision": "bf16"}
    recipe = SimpleNamespace(
        base=str(tmp_path),
        compute=SimpleNamespace(target="trn2-ultraserver", chips=64),
        stages=[PretrainStage(name="cpt", kind="pretrain", mixture={"a": 1}, max_tokens=10**9, **common),
                MidtrainStage(name="mid", kind="midtrain", mixture={"a": 1}, max_steps=10, **common),
                SoupStage(name="soup", kind="soup", ingredients=["cpt", "mid"])])
    plans = plan_recipe(recipe)
    assert [(p.stage, p.kind) for p in plans] == [("cpt", "pretrain"), ("mid", "midtrain")]  # a soup trains nothing
    assert all(p.feasible and p.chips == 64 and p.target == "trn2-ultraserver" for p in plans)
    assert plans[0].global_batch == 4 * 2 * 64                     # batch_size * grad_accum * chips
    assert plans[1].steps == 10
    both = plan_recipe(recipe, target="trn3,h100:16")
    assert [(p.stage, p.target, p.chips) for p in both][:2] == [("cpt", "trn3-ultraserver", 144),
                                                               ("cpt", "p5.48xlarge", 16)]


def test_plan_recipe_with_a_scratch_model_on_local():
    from forge.recipe import PretrainStage

    cfg = tiny_config("qwen3").to_dict()
    recipe = SimpleNamespace(base=SimpleNamespace(hf_config=lambda: cfg),
                             compute=SimpleNamespace(target="local", chips=None),
                             stages=[PretrainStage(name="tiny", kind="pretrain", mixture={"a": 1}, max_steps=10,
                                                   seq_len=64, batch_size=8, grad_accum=1, precision="fp32")])
    (plan,) = plan_recipe(recipe)
    assert plan.feasible and plan.target == "local" and plan.chips == 1 and plan.global_batch == 8
