"""Calibration of the local target: synthetic runs, each recording into its own folder -> fit
(outliers rejected, runs named) -> a calibration file that predictions use only when given it."""
import random

import pytest
import yaml

from forge.errors import ForgeError
from forge.plan import workloads as W
from forge.plan.calibrate import calibrate, fit_calibration, load_measurements, predict_local_step, record_measurement
from forge.plan.hardware import load_catalog, user_hardware_file
from forge.plan.planner import plan_stage
from plan_fixtures import tiny_config

TRUE_TFLOPS = 0.037       # this "machine"
TRUE_OVERHEAD = 0.012     # seconds per step
TRUE_MEM_SCALE = 1.3


def _record_synthetic_runs(store, cfg, shapes, noise=0.01, slow=()):
    """One run folder per shape under `store`; runs in `slow` were slowed 2x by another job."""
    rng = random.Random(0)
    for i, (seq, mb, accum) in enumerate(shapes):
        predicted = predict_local_step(cfg, seq, mb, accum, "fp32")
        seconds = predicted["flops_per_step"] / (TRUE_TFLOPS * 1e12) + TRUE_OVERHEAD
        seconds *= (1 + rng.uniform(-noise, noise)) * (2.0 if i in slow else 1.0)
        measured = {"step_time_s": seconds, "tokens_per_s": predicted["tokens_per_step"] / seconds,
                    "peak_mem_bytes": predicted["peak_mem_bytes"] * TRUE_MEM_SCALE,
                    "flops_per_step": predicted["flops_per_step"], "precision": "fp32"}
        record_measurement(store / f"run{i}", predicted, measured, stage="pretrain")


SHAPES = [(64, 2, 1), (128, 4, 1), (256, 4, 2), (128, 8, 4), (512, 2, 1)]


def test_fit_makes_local_predictions_match_measurements(tmp_path):
    cfg = tiny_config("llama").to_dict()
    store = tmp_path / "runs"
    _record_synthetic_runs(store, cfg, SHAPES)
    assert len(load_measurements(store)) == len(SHAPES)

    before = predict_local_step(cfg, 256, 4, 2, "fp32")
    assert not before["calibrated"]
    cal, path = calibrate(store)
    assert path == store / "calibration.yaml" and path.is_file()
    assert not user_hardware_file().exists()                               # nothing global is written
    assert cal.effective_tflops["fp32"] == pytest.approx(TRUE_TFLOPS, rel=0.03)
    assert cal.memory_scale == pytest.approx(TRUE_MEM_SCALE)
    assert cal.used == [f"run{i}/pretrain" for i in range(len(SHAPES))] and cal.rejected == []
    assert not predict_local_step(cfg, 256, 4, 2, "fp32")["calibrated"]    # applied only where asked

    catalog = load_catalog((path,))
    for seq, mb, accum in [(256, 4, 2), (1024, 1, 1), (96, 16, 2)]:       # seen and unseen shapes
        after = predict_local_step(cfg, seq, mb, accum, "fp32", catalog=catalog)
        truth = after["flops_per_step"] / (TRUE_TFLOPS * 1e12) + TRUE_OVERHEAD
        assert after["calibrated"]
        assert after["step_time_s"] == pytest.approx(truth, rel=0.03)
        assert after["tokens_per_s"] == pytest.approx(after["tokens_per_step"] / truth, rel=0.03)


def test_calibration_leaves_the_user_file_alone_and_rejects_outliers(tmp_path):
    user = user_hardware_file()
    user.parent.mkdir(parents=True, exist_ok=True)
    before = yaml.safe_dump({"systems": {"p5.48xlarge": {"price": {"usd_per_chip_hour": 3.0}}}})
    user.write_text(before)
    store = tmp_path / "runs"
    shapes = SHAPES + [(64, 4, 1), (256, 2, 1)]
    _record_synthetic_runs(store, tiny_config("qwen2").to_dict(), shapes, noise=0, slow=(2,))
    cal, path = calibrate(store, tmp_path / "cal.yaml")
    assert user.read_text() == before
    assert cal.runs == len(shapes) - 1 and "run2/pretrain" not in cal.used
    assert len(cal.rejected) == 1 and cal.rejected[0].startswith("run2/pretrain")
    assert cal.effective_tflops["fp32"] == pytest.approx(TRUE_TFLOPS, rel=1e-6)   # the slowed run left out
    data = yaml.safe_load(path.read_text())
    assert data["chips"]["local-cpu"]["calibration"]["runs"] == len(shapes) - 1


def test_local_plans_use_the_calibration(tmp_path):
    cfg = tiny_config("llama").to_dict()
    store = tmp_path / "runs"
    _record_synthetic_runs(store, cfg, SHAPES, noise=0)
    _, path = calibrate(store)
    wl = W.pretrain("tiny", 128, 8, steps=100, precision="fp32")
    catalog = load_catalog((path,))
    plan = plan_stage(cfg, wl, "local", catalog=catalog)
    expected = predict_local_step(cfg, 128, 8, 1, "fp32", catalog=catalog)["step_time_s"]
    assert plan.step_time_s == pytest.approx(expected, rel=1e-6)
    assert any("calibrated" in n for n in plan.notes)


def test_single_shape_fits_through_the_origin():
    rows = [{"predicted": {"flops_per_step": 1e12}, "measured": {"step_time_s": 20.0, "precision": "bf16"}}] * 3
    cal = fit_calibration(rows)
    assert cal.effective_tflops["bf16"] == pytest.approx(0.05) and cal.step_overhead_s["bf16"] == 0.0


def test_no_measurements_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ForgeError, match="run a local stage first"):
        calibrate(tmp_path / "empty")
    with pytest.raises(ForgeError, match="no such folder"):
        calibrate(tmp_path / "missing")
    with pytest.raises(ForgeError, match="output folder"):
        record_measurement(None, {}, {"step_time_s": 1.0})
    with pytest.raises(ForgeError, match="step_time_s"):
        record_measurement(tmp_path, {}, {"tokens_per_s": 1.0})


def test_comparison_metrics_for_mlflow():
    from forge.plan.calibrate import comparison_metrics
    m = comparison_metrics({"step_time_s": 2.0, "tokens_per_s": 100.0, "peak_mem_bytes": 10.0},
                           {"step_time_s": 3.0, "tokens_per_s": 50.0})
    assert m["plan.measured_over_predicted.step_time_s"] == 1.5
    assert m["plan.predicted.peak_mem_bytes"] == 10.0 and "plan.measured.peak_mem_bytes" not in m
