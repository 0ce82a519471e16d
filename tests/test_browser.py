"""The MLflow experience in a real browser: a tiny recipe, `forge ui` on its store, headless Chromium
(the system's, through Playwright; nothing downloaded) at 1600x1000 on the experiment's runs, the
parent run, its comparison table, a stage's charts and the registered version, each in MLflow's
model-training layout. Screenshots go to $FORGE_TEST_ARTIFACTS (default tests/artifacts/)."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import mlflow
import pytest

from forge import cli
from forge_testing import base_recipe, pretrain_stage, write_recipe
from servers import ROOT, forge_ui

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 120_000  # the UI's first load is slow on a busy 2-core machine


def artifacts_dir() -> Path:
    out = Path(os.environ.get("FORGE_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.slow
def test_forge_ui_in_chromium(tmp_path):
    if CHROMIUM is None:
        pytest.skip("no system Chromium (.ci/run installs Debian's chromium: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the test extra) drives Chromium")
    recipe = base_recipe(tmp_path, stages=[
        pretrain_stage("general", max_steps=8, eval={"every": 4, "max_blocks": 4}),
        pretrain_stage("domain", mixture={"domain": 0.7, "general": 0.3}, max_steps=8, eval={"every": 4, "max_blocks": 4}),
    ], tracking={"alias": "champion"})
    assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("tiny").experiment_id
    runs = {r.info.run_name: r.info.run_id for r in client.search_runs([exp])}
    shots = artifacts_dir()

    with forge_ui("--output", str(tmp_path / "out")) as ui, sync_api.sync_playwright() as pw:
        url, base = ui.url, ui.base
        # the runs table in forge's shared view (forge.track.view), in the model-training layout
        assert url == f"{base}/#/experiments/{exp}/runs?workflowType=machine_learning&viewStateShareKey=forge"
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1600, "height": 1000})
        page = browser.new_page()

        view = "?workflowType=machine_learning"

        def visit(address: str, *texts: str, shot: str, frame: str | None = None, scroll: str | None = None) -> str:
            page.goto(address)
            where = page.frame_locator(frame) if frame else page
            for text in texts:
                where.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=WAIT_MS)
            # MLflow 3's Assistant panel opens by itself on a browser's first visit and MLflow has no
            # setting to keep it off (forge ui says so): closed once, as a person would
            close = page.get_by_role("button", name="Close", exact=True)
            if close.count():
                close.first.click()
            if scroll:  # the part the screenshot is for
                page.get_by_text(scroll, exact=True).first.scroll_into_view_if_needed()
            page.wait_for_timeout(2500)  # charts finish drawing
            page.screenshot(path=str(shots / shot))
            return page.inner_text("body")

        # the experiment: the parent and both stages each a row (not one collapsed parent), the
        # stages' eval loss and the start-versus-Novella figures as columns, in the training layout
        body = visit(url, "Run Name", "3 matching runs", "novella/ppl.domain", shot="ui-experiment.png")
        assert "Model training" in body and "Sort: Created" in body
        assert "Evaluation runs" not in body and "Sessions" not in body  # the GenAI layout's sidebar
        for column in ("eval/loss", "start/ppl.domain", "novella/ppl.domain", "novella/retention.general"):
            assert column in body, column
        for name in ("tiny", "general", "domain"):
            assert page.get_by_role("link", name=name, exact=True).first.is_visible(), name
        parent = client.get_run(runs["tiny"]).data.metrics
        assert f"{parent['novella/ppl.domain']:g}" in body  # the parent row's figure, in its column
        # the parent run: its description's first line, its headline figures as metrics, the stages
        body = visit(f"{base}/#/experiments/{exp}/runs/{runs['tiny']}{view}", "tiny: 2 stage(s) from scratch llama",
                     shot="ui-parent-run.png")
        assert "Child runs" in body and "domain" in body and "general" in body
        shown = re.search(r"Metrics \((\d+)\)", body)
        assert shown and int(shown.group(1)) == len(parent) >= 8, body[:3000]
        assert "Evaluation runs" not in body
        # the comparison as a table beside its chart (an HTML artifact, drawn in a frame)
        body = visit(f"{base}/#/experiments/{exp}/runs/{runs['tiny']}/artifacts/eval/comparison.html{view}",
                     "start versus novella", "ppl.domain", shot="ui-comparison.png", frame="iframe")
        assert "comparison.png" in body and "comparison.html" in body
        # a stage's charts: curves in sections by prefix, and no one-point charts of single figures
        # (eval/, eval/<source>/ sort before train/, whose charts MLflow draws only once scrolled to)
        body = visit(f"{base}/#/experiments/{exp}/runs/{runs['domain']}/model-metrics{view}",
                     "(eval/loss)", "(eval/domain/loss)", shot="ui-stage-charts.png")
        assert re.search(r"\beval\s*\(2\)", body) and re.search(r"\btrain\s*\(\d+\)", body), body[:2000]
        assert "(eval/ppl)" in body
        assert not any(word in body for word in ("final.", "plan.", "hygiene"))
        # the registered version: the alias, the description's first line, a handful of tags
        body = visit(f"{base}/#/models/tiny/versions/1{view}", "Novella tiny: scratch llama", "champion",
                     "forge.primary_metric", shot="ui-model.png", scroll="forge.primary_metric")
        assert "forge.base" in body and "forge.compute" not in body and "forge.plan" not in body
        browser.close()
    for name in ("ui-experiment.png", "ui-parent-run.png", "ui-comparison.png", "ui-stage-charts.png", "ui-model.png"):
        assert (shots / name).stat().st_size > 10_000, name
