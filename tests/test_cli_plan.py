"""`forge run`'s plan: one plain line per stage (steps, time here and on the recipe's own target)
at the local rate it says it used: a calibration in the output folder or the recipe (also for
`forge plan`), else this machine measured once and cached in the output folder, else the guess."""
from __future__ import annotations

import json
import re

import pytest

from forge import cli
from forge.plan.calibrate import Calibration, write_calibration
from forge_testing import base_recipe, pretrain_stage, write_recipe

NUMBER = r"(?:~([0-9.]+) (s|min)|<0\.1 s)"


def _seconds(text: str) -> float:
    """The time a line says (0.1 for '<0.1 s', an upper bound)."""
    value, unit = re.fullmatch(NUMBER, text).groups()
    return 0.1 if value is None else float(value) * (60 if unit == "min" else 1)


def _plan_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("plan: ")]


@pytest.fixture
def two_stages(tmp_path):
    stages = [pretrain_stage(max_steps=2), pretrain_stage(name="wide", max_steps=3, seq_len=64, batch_size=2)]
    return write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=stages, tracking={"register_model": False}))


@pytest.mark.slow
def test_run_prints_a_plain_line_per_stage_at_the_rate_measured_here_and_caches_it(two_stages, tmp_path, capsys,
                                                                                   monkeypatch):
    assert cli.main(["run", str(two_stages)]) == 0
    out = capsys.readouterr().out
    cache_file = tmp_path / "out" / "local-rate.json"
    cpt, wide = _plan_lines(out)
    assert re.fullmatch(rf"plan: cpt \(pretrain\): 2 steps, {NUMBER} here \(measured rate\)", cpt), cpt
    assert re.fullmatch(rf"plan: wide \(pretrain\): 3 steps, {NUMBER} here \(measured rate\)", wide), wide
    assert f"  local rate measured here just now, cached in {cache_file}; the full table: forge plan {two_stages}" in out
    assert "tp1" not in out and "Stage 'cpt'" not in out and "mem/chip" not in out  # the table is forge plan's

    # the predicted time is the measured step time times the steps; the run records it beside what it measured
    entries = {e["shape"]["seq_len"]: e for e in json.loads(cache_file.read_text())["entries"].values()}
    assert set(entries) == {32, 64} and all(e["timed_steps"] >= 1 for e in entries.values())
    said, predicted = re.search(NUMBER, cpt).group(0), 2 * entries[32]["step_time_s"]
    assert predicted < 0.1 if said.startswith("<") else _seconds(said) == pytest.approx(predicted, rel=0.06, abs=0.006)
    row = json.loads((tmp_path / "out" / "stages" / "cpt" / "measurements.jsonl").read_text().splitlines()[-1])
    assert row["predicted"]["step_time_s"] == pytest.approx(entries[32]["step_time_s"], rel=1e-6)
    assert row["predicted"]["rate"].startswith("measured here")

    # a second run finds the measurement in the output folder and does not measure again
    def no_measurement(*_a, **_k):
        raise AssertionError("measured again")

    monkeypatch.setattr("forge.plan.measure.measure", no_measurement)
    before = cache_file.read_text()
    assert cli.main(["run", str(two_stages), "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert f"  local rate measured here earlier, cached in {cache_file}" in out
    assert [re.sub(NUMBER, "", line) for line in _plan_lines(out)] == [re.sub(NUMBER, "", cpt), re.sub(NUMBER, "", wide)]
    assert cache_file.read_text() == before


@pytest.mark.slow
def test_a_calibration_in_the_output_folder_is_used_by_run_and_plan_and_named(two_stages, tmp_path, capsys):
    out_dir = tmp_path / "out"
    cal = write_calibration(Calibration(effective_tflops={"fp32": 1e-4}, step_overhead_s={"fp32": 0.25}, runs=3),
                            out_dir / "calibration.yaml")
    assert cli.main(["plan", str(two_stages)]) == 0
    text = capsys.readouterr().out
    assert f"local rate: calibrated from {cal}" in text and f"local rate calibrated from {cal} (3 run(s))" in text
    assert cli.main(["plan", str(two_stages), "--json"]) == 0
    plans = {p["stage"]: p for p in json.loads(capsys.readouterr().out)}
    flops = plans["cpt"]["flops_per_token"] * 32 * 4
    assert plans["cpt"]["step_time_s"] == pytest.approx(flops / 1e8 + 0.25, rel=1e-6)

    assert cli.main(["run", str(two_stages)]) == 0
    out = capsys.readouterr().out
    assert f"  local rate calibrated from {cal}; the full table" in out
    assert all(line.endswith("here (calibrated rate)") for line in _plan_lines(out))
    assert not (out_dir / "local-rate.json").exists()  # nothing measured


def test_plan_uses_the_recipes_own_calibration_and_says_when_it_has_none(tmp_path, capsys):
    cal = write_calibration(Calibration(effective_tflops={"fp32": 1e-4}, runs=2), tmp_path / "mine.yaml")
    with_cal = write_recipe(tmp_path / "c.yaml", base_recipe(tmp_path, compute={"calibration": str(cal)}))
    assert cli.main(["plan", str(with_cal)]) == 0
    assert f"local rate: calibrated from {cal}" in capsys.readouterr().out
    plain = write_recipe(tmp_path / "p.yaml", base_recipe(tmp_path))
    assert cli.main(["plan", str(plain), "--no-measure"]) == 0
    text = capsys.readouterr().out
    assert "local rate: uncalibrated" in text and "Stage 'cpt'" in text  # forge plan keeps the full table


def test_the_line_names_the_recipes_own_target(tmp_path):
    from forge.plan.run_plan import run_plans
    from forge.recipe import load_recipe

    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, compute={"target": "trn3", "chips": 16}))
    plans, lines = run_plans(load_recipe(str(path)), str(path), print, measure=False)
    assert [p.target for p in plans] == ["trn3-ultraserver"]  # what the run logs: the recipe's own target
    assert re.fullmatch(rf"plan: cpt \(pretrain\): 4 steps, {NUMBER} here \(uncalibrated guess\), {NUMBER} "
                        r"on trn3-ultraserver x16", lines[0]), lines[0]
    assert lines[1] == f"  local rate uncalibrated; the full table: forge plan {path}"
