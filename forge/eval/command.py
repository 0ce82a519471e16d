"""`forge eval`: run an evaluation suite on several models and compare them side by side.

  forge eval RECIPE [key=value ...]         the run's starting checkpoint, each stage's output and
                                            the Novella, with the recipe's eval: block (or its
                                            default: held-out perplexity of every trained source)
  forge eval --models A,B,... --suite FILE  any model folders (label=path to name them); FILE is
                                            YAML with data: (sources, as in a recipe) and eval:

Deltas are against the first model. --json / --markdown / --chart write the table as JSON,
Markdown and a PNG, each into a folder that exists, outside run folders, Novellas and the models
compared, replacing only a report forge eval wrote (or any file, with --overwrite); the recipe's
gates are checked on the last model, and --strict exits 1 if one fails. With a recipe, the run's
folder is refused while a `forge run` holds it (and held while evaluating); when the run is
tracked, the evaluation is an MLflow run of its own, nested under the run's parent: its figures,
the table and the chart (the run's own runs are not changed).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from forge.errors import LOOP, ForgeError, symlink_loop
from forge.quiet import quiet_libraries
from forge.recipe.data import DataSource, Strict
from forge.recipe.eval import EvalBlock


class SuiteFile(Strict):
    data: dict[str, DataSource]
    eval: EvalBlock = EvalBlock()


def add_arguments(p) -> None:
    from forge.eval.table import EVALUATORS

    p.epilog = "evaluators (the blocks of a suite's eval:, run in this order):\n" + "\n".join(
        f"  {e.block}: {e.summary}" for e in EVALUATORS.values())
    p.add_argument("recipe", nargs="?", help="a recipe whose run to evaluate (its output folder)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides for the recipe")
    p.add_argument("--models", help="comma-separated model folders (label=path to name one); the first is the baseline")
    p.add_argument("--suite", help="with --models: YAML with data: and eval: (a recipe's eval: block)")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the comparison as a Markdown table")
    p.add_argument("--chart", metavar="FILE", help="write a PNG chart of each metric across the models")
    p.add_argument("--overwrite", action="store_true",
                   help="let --json/--markdown/--chart replace a file forge eval did not write")
    p.add_argument("--strict", action="store_true", help="exit 1 when a gate fails")


def _load_suite(path: str):
    from forge.inputs import resolve_source
    from forge.recipe import resolve_paths
    from forge.recipe.errors import format_errors
    from forge.recipe.yaml import read_recipe_yaml

    file = Path(path)
    if symlink_loop(file):
        raise ForgeError(f"--suite {path}: {LOOP}")
    if not file.is_file():
        raise ForgeError(f"--suite {path}: no such file")
    raw, lines = read_recipe_yaml(file)  # the recipe's safe reader: encoding, duplicate keys, alias bombs
    if not isinstance(raw, dict):
        raise ForgeError(f"{path}: a suite is a YAML mapping with data: and eval:")
    raw = resolve_paths(raw, file.parent.resolve())
    try:
        spec = SuiteFile.model_validate(raw)
    except ValidationError as e:
        raise ForgeError("\n".join(format_errors(e, SuiteFile, path, lines, {}))) from None
    unknown = [n for n in spec.eval.sources() if n not in spec.data]
    if unknown:
        raise ForgeError(f"{path}: eval: unknown data source(s) {unknown}; known: {sorted(spec.data)}")
    generated = Path(tempfile.mkdtemp(prefix="forge-eval-"))
    return spec, {n: resolve_source(n, cfg, generated) for n, cfg in spec.data.items()}


def _models_arg(text: str) -> dict[str, Path]:
    models: dict[str, Path] = {}
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        label, _, path = item.partition("=") if "=" in item else (Path(item).name, "", item)
        label = label or Path(path).name
        if symlink_loop(path):
            raise ForgeError(f"--models {path}: {LOOP}")
        while label in models:
            label += "'"
        models[label] = Path(path)
    if len(models) < 1:
        raise ForgeError("--models: give at least one model folder")
    return models


def _run_outputs(recipe) -> dict[str, Path]:
    """Each finished stage's output and the Novella in the recipe's output folder (reading only:
    a folder that holds none is refused before anything is written into it)."""
    from forge.eval.finish import NOVELLA
    from forge.rundir import RunLayout

    layout = RunLayout(Path(recipe.output))
    models: dict[str, Path] = {}
    novella = (layout.novella / "config.json").is_file()
    for stage in recipe.stages[:-1] if novella else recipe.stages:  # the last one's output is the Novella
        if (layout.stage_final(stage.name) / "config.json").is_file():
            models[stage.name] = layout.stage_final(stage.name)
    if novella:
        models[NOVELLA] = layout.novella
    if not models:
        raise ForgeError(f"{layout.out}: no stage output or Novella to evaluate yet; run `forge run` first")
    return models


def _hold(recipe) -> int:
    """Refuse a folder a `forge run` holds (naming its pid) or that holds no run, before writing
    anything; then hold its lock for the evaluation (a run cannot start meanwhile)."""
    from forge.rundir import check_forge_folder, holder, lock_folder, write_holder

    out = Path(recipe.output)
    who = holder(out)
    if who is not None:
        raise ForgeError(f"output: {out} is in use by a running forge run ({who}); evaluate it when the run ends")
    if out.is_dir():
        check_forge_folder(out)  # forge writes its data caches only into a folder of its own
    _run_outputs(recipe)
    fd = lock_folder(out)
    write_holder(fd)
    return fd


def run(args) -> int:
    from forge.eval.suite import resolve_suite

    if bool(args.recipe) == bool(args.models):
        raise ForgeError("give a recipe, or --models with --suite")
    models = [] if args.recipe else list(_models_arg(args.models).values())
    _reports(args, models)  # refused before any work, as any of them would be at the end
    quiet_libraries()
    if args.recipe:
        from forge.recipe import load_recipe

        recipe = load_recipe(args.recipe, args.overrides)
        fd = _hold(recipe)
        try:
            return _evaluate_run(args, recipe)
        finally:
            os.close(fd)
    if not args.suite:
        raise ForgeError("--models needs --suite FILE (data: and eval:)")
    spec, sources = _load_suite(args.suite)
    suite, models = resolve_suite(spec.eval, [], spec.data), _models_arg(args.models)
    return _compare(args, suite, sources, models, None)


def _reports(args, models: list[Path]) -> dict[str, Path]:
    """{option: path} of the reports asked for, each checked (forge.eval.outputs)."""
    from forge.eval.outputs import check_reports

    wanted = {"--json": args.json, "--markdown": args.markdown, "--chart": args.chart}
    return check_reports(wanted, models, args.overwrite)


def _evaluate_run(args, recipe) -> int:
    from forge.eval.finish import START
    from forge.eval.suite import resolve_suite
    from forge.inputs import prepare_inputs
    from forge.track.runs import RunIds

    inputs = prepare_inputs(recipe, Path(recipe.output))
    suite = resolve_suite(recipe.eval, recipe.stages, recipe.data)
    models = {START: inputs.base, **_run_outputs(recipe)}
    runs = RunIds.load(Path(recipe.output))
    return _compare(args, suite, inputs.sources, models, (recipe, runs.parent) if runs.parent else None)


def _compare(args, suite, sources, models, tracked) -> int:
    """Run the suite on `models`, print and write the table, check the gates; with `tracked`
    (recipe, parent run id), log the evaluation as its own MLflow run under the run's parent."""
    from forge.eval.finish import Evaluation, log_comparison
    from forge.eval.gates import check_gates
    from forge.eval.outputs import write_report
    from forge.eval.report import chart_png, format_table, json_report, markdown_report
    from forge.eval.suite import primary_metric, run_suite

    comparison = run_suite(models, suite, sources, log=lambda m: print(m, file=sys.stderr))
    ev = Evaluation(comparison, check_gates(suite, comparison.metrics[comparison.models[-1]]), primary_metric(suite))
    print(format_table(comparison), end="")
    for g in ev.gates:
        print(f"gate {g.text}")
    extra = {"primary": ev.primary, "gates": [g.as_dict() for g in ev.gates], "passed": ev.passed}
    # checked again: the evaluation took a while, and what is at each path may have changed meanwhile
    write = {"--json": lambda: json_report(comparison, extra), "--markdown": lambda: markdown_report(comparison),
             "--chart": lambda: chart_png(comparison)}
    for flag, path in _reports(args, list(models.values())).items():
        write_report(path, write[flag]())
    if tracked:
        from forge.track import MlflowTracker

        recipe, parent = tracked
        tracker = MlflowTracker(recipe.tracking_uri, recipe.experiment)
        # its own run, nested under the parent: the parent's figures (and params) stay the run's own,
        # and each `forge eval` is a record of its own, whatever its suite
        tags = {"mlflow.parentRunId": parent, "forge.eval_of": parent, "forge.pipeline": "eval"}
        with tracker.run("forge eval", tags=tags) as run_id:
            log_comparison(tracker, ev, {})
        print(f"mlflow:  logged to run {run_id}, under the run's parent {parent} ({recipe.tracking_uri})",
              file=sys.stderr)
    if not ev.passed:
        failed = [g for g in ev.gates if not g.passed]
        print(f"forge: {len(failed)} gate(s) failed on {comparison.models[-1]}", file=sys.stderr)
        return 1 if args.strict else 0
    return 0
