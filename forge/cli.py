"""The `forge` command: validate, plan, run and evaluate recipes; export and deploy Novellas."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import shlex
import signal
import sys
from pathlib import Path

# OpenMP threads that wait for work spin briefly, then sleep (libgomp, torch's OpenMP on Linux).
# Unset, they spin 300,000 rounds: a thread whose core another process holds stalls every parallel
# region (forge-tiny's step 4.3x slower with one core busy, bench/bench_omp.py); PASSIVE (never spin)
# pays a wake-up on every region, 1.4x slower on idle cores. Set before torch loads (libgomp reads
# it once); a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")

from forge.errors import LOOP, ForgeError
from forge.pipeline import Pipeline, PipelineContext
from forge.progress import phase, say
from forge.quiet import quiet_libraries
from forge.scrub import scrub


def _validate(args) -> int:
    from forge.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    check_pipeline(args, recipe.pipeline)
    kinds = ", ".join(f"{s.name} ({s.kind})" for s in recipe.stages)
    print(f"{args.recipe}: ok: {recipe.name}: {len(recipe.stages)} stage(s): {kinds}; output {recipe.output}")
    _advise(recipe)
    code = user_code(recipe)
    if code:
        print("code this recipe runs (rewards, custom evaluators):")
        for where, what in code:
            print(f"  {where}: {what}")
    return 0


def _advise(recipe) -> None:
    """Starting-point advice (forge.advice) and, for a family not built yet, when it will be: on stderr."""
    from forge import advice, catalog

    for warning in advice.warnings(recipe):
        print(f"forge: warning: {warning}", file=sys.stderr)
    for ref in advice.unbuilt(recipe):
        print(f"forge: {catalog.build_note(ref)}", file=sys.stderr)


def _build_foundations(args, recipe) -> bool:
    """Build, once, the catalog families the recipe needs that are not built yet (the pipeline the
    catalog names, found by name like a recipe's); True when something was built."""
    from forge import advice, catalog
    from forge.train.accel import process_state

    todo = advice.unbuilt(recipe)
    for ref, name in todo.items():
        if process_state().is_main_process:
            home = catalog.build_home(ref)
            print(f"forge: building the {catalog.family_of(ref)} foundation once (pipelines/{name}.py) into {home}; "
                  "later runs reuse it", file=sys.stderr)
            _pipeline(args.recipe, name).build(home, lambda msg: print(msg, file=sys.stderr, flush=True))
        process_state().wait_for_everyone()
    return bool(todo)


def user_code(recipe) -> list[tuple[str, str]]:
    """(dotted field, what runs) for every reward source and custom evaluator the recipe would
    execute: a Python file by its resolved path, a module with where it is installed, an endpoint
    with its credentials scrubbed, a Lambda by name (SECURITY.md: `forge validate` lists them). A
    reward source is described by its transport's row (forge.recipe.reward_table)."""
    from forge.recipe.reward_table import describe_source
    from forge.usercode import describe_code

    found = [(f"stages[{i}].rewards[{j}]", describe_source(r.source)) for i, s in enumerate(recipe.stages)
             for j, r in enumerate(getattr(s, "rewards", None) or [])]
    ev = recipe.eval
    if ev is not None and ev.reward is not None:
        found += [(f"eval.reward.rewards[{j}]", describe_source(r.source)) for j, r in enumerate(ev.reward.rewards or [])]
    if ev is not None:
        found += [(f"eval.custom[{j}]", describe_code(spec)) for j, spec in enumerate(ev.custom)]
    return [(where, scrub(what)) for where, what in found]  # a URL's password, ?token=...


def _run(args) -> int:
    from forge.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    check_pipeline(args, recipe.pipeline)  # before torch loads: a misspelt name costs no wait
    say(opening_line(args.recipe, recipe))  # within a second or two: torch, transformers and mlflow load after it
    with phase("loading torch, transformers, MLflow and the pipeline", done=False):
        quiet_libraries()
        from forge.train.accel import process_state

        pipeline = _pipeline(args.recipe, recipe.pipeline)
    if _build_foundations(args, recipe):  # read again: the built family's manifest is authoritative
        recipe = load_recipe(args.recipe, args.overrides)
    from forge.plan.recipe_plan import plan_recipe
    from forge.plan.record import COMPARE_TARGETS
    from forge.plan.report import assert_plans_fit

    # every refusal (the plan does not fit, no such pipeline, the folder in use or not startable)
    # comes before any output or any write
    plans = plan_recipe(recipe)  # planned once per run: printed, checked, and logged by each stage
    comparison: dict[str, list] = {}
    for plan in plan_recipe(recipe, target=COMPARE_TARGETS):
        comparison.setdefault(plan.stage, []).append(plan)
    warnings = assert_plans_fit(plans, force=args.force)
    rank0 = process_state().is_main_process  # the same notion of rank the pipeline and stages use
    # a launcher stops the other ranks with SIGTERM when one fails: exit through Python so that
    # open MLflow runs are ended FAILED rather than left RUNNING (inside a training loop, the first
    # SIGTERM or SIGINT instead finishes the step and writes a checkpoint: forge.train.signals)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with _run_folder(recipe, args, process_state()) as folder:
        if rank0:  # what it decided is done now, after every refusal; the other ranks then follow
            if not folder.finished_before:
                folder.begin(log=lambda msg: print(msg, file=sys.stderr))
            process_state().wait_for_everyone()
        if folder.finished_before:
            if not rank0:
                return 0
            print(f"forge: {recipe.output} holds a finished run (started {folder.record.get('started')}): "
                  f"nothing to resume, nothing changed; its Novella: {folder.layout.novella} "
                  "(add --overwrite to run it again)", file=sys.stderr)
            return 0
        if rank0:
            plans = _say_plan(args, recipe, process_state().num_processes == 1)
        for warning in warnings:
            print(f"forge: warning: --force given, running anyway: {warning}", file=sys.stderr)
        try:
            result = _run_pipeline(pipeline, recipe, _tracker(recipe, rank0), (plans, comparison), args, folder)
        except BaseException as e:
            if rank0 and isinstance(e, ForgeError) and not folder.resumable():
                folder.forget()  # bad input before anything resumable: the folder stays startable as it was
            code = _stopped(e, args, rank0, process_state().num_processes)
            if code is None:
                raise
            return code
        if rank0:
            folder.finish()
    if rank0:
        return _say_result(args, recipe, result)
    return 0


def _tracker(recipe, rank0: bool):
    """The run's MLflow tracker (rank 0's records; a new SQLite store is created and migrated first)."""
    from forge.track import MlflowTracker

    with phase(f"opening the MLflow store {recipe.tracking_uri}", enabled=rank0, done=False):
        return MlflowTracker(recipe.tracking_uri, recipe.experiment, enabled=rank0,
                             on_error=recipe.tracking.on_error, system_metrics=recipe.tracking.system_metrics)


def opening_line(path: str, recipe) -> str:
    """`forge run`'s first line: which recipe, its stages, where it writes."""
    stages = ", ".join(f"{s.name} ({s.kind})" for s in recipe.stages)
    return f"forge run {path}: {recipe.name}, {len(recipe.stages)} stage(s): {stages}; output {recipe.output}"


def _say_plan(args, recipe, measure: bool) -> list:
    """One line per stage (the time predicted here and on the recipe's target), at the local rate
    of a calibration file, else of this machine measured (once: cached in the output folder);
    the plans to log. The full table is `forge plan`'s."""
    from forge.plan.run_plan import run_plans

    plans, lines = run_plans(recipe, args.recipe, say, measure=measure)
    print("\n".join(lines), flush=True)
    return plans


def _say_result(args, recipe, result) -> int:
    """The run's summary (forge.eval.summary: stages, start versus Novella, gates, where things are),
    printed and kept at the end of the run's log; failed gates also on stderr."""
    from forge.eval import summary

    summary.write(summary.render(summary.ending(recipe, result, ui_command(args.recipe, recipe, args.overrides))),
                  recipe.output)
    failed = _report_evaluation(result.evaluation)
    return 1 if failed and args.strict else 0


def check_pipeline(args, name: str) -> None:
    """Refuse a recipe whose `pipeline:` names no module in pipelines/, listing those there, without
    importing any (a pipeline imports torch; only the pipelines package's own __init__ runs)."""
    import importlib.util
    import pkgutil

    found = importlib.util.find_spec("pipelines")
    known = sorted(m.name for m in pkgutil.iter_modules(found.submodule_search_locations or [])) if found else []
    if name in known:
        return
    from forge.recipe.yaml import read_recipe_yaml

    override = next((o for o in args.overrides if o.split("=", 1)[0].strip() == "pipeline"), None)
    line = read_recipe_yaml(Path(args.recipe))[1].get(("pipeline",))
    at = f":override {override!r}" if override else (f":line {line}" if line else "")
    raise ForgeError(f"{args.recipe}{at}: pipeline: no pipeline named {name!r} (looked for pipelines/{name}.py); "
                     f"the pipelines: {', '.join(known) or 'none (the pipelines package is not installed)'}")


def _pipeline(recipe_path: str, name: str):
    """The pipeline module a recipe names (pipelines/NAME.py)."""
    try:
        return importlib.import_module(f"pipelines.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("pipelines", f"pipelines.{name}"):
            raise  # a dependency of the pipeline is missing: not the user's recipe
        raise ForgeError(f"{recipe_path}: pipeline: no pipeline named {name!r} (looked for pipelines/{name}.py)") from None


def _run_pipeline(pipeline: Pipeline, recipe, tracker, planned: tuple, args, folder):
    """The pipeline's run with the plans made once (printed by rank 0, whose tracker is enabled)."""
    from forge import runlog

    plans, comparison = planned
    if tracker.enabled:  # rank 0: what the pipeline says is printed and kept in OUTPUT/forge.log
        runlog.begin(recipe.output, opening_line(args.recipe, recipe), resume=args.resume)
    return pipeline.run(PipelineContext(recipe, tracker, {p.stage: p for p in plans}, comparison,
                                        log=runlog.echo(recipe.output) if tracker.enabled else (lambda *_: None),
                                        resume=args.resume, folder=folder))


def resume_command(args) -> str:
    """The command that continues this run, quoted for a POSIX shell (paths and overrides may hold
    spaces, quotes or `$(...)`: pasted back, they are words, never code); under torchrun, the same
    torchrun line (processes, rendezvous) with forge's words after it."""
    from forge.train.launcher import launcher_words

    return shlex.join([*(launcher_words() or ["forge"]), "run", args.recipe, *args.overrides, "--resume"])


def _stopped(e: BaseException, args, rank0: bool, world_size: int = 1) -> int | None:
    """A run stopped on a signal (a checkpoint written, or in data preparation, evaluation or
    registration), or by another rank dying mid-collective: say how to continue it; the exit
    status (None: not a stop, re-raise)."""
    from forge.train.launcher import peer_failure
    from forge.train.signals import StopRequested

    peer = peer_failure(e, world_size)
    if peer is not None:
        why, code = f"another rank of this {world_size}-process run stopped or died ({peer}); its output says why", 1
    elif isinstance(e, StopRequested):
        why, code = str(e), 130
    elif isinstance(e, SystemExit) and e.code == 128 + signal.SIGTERM:
        why, code = "stopped by SIGTERM before the run finished", 128 + signal.SIGTERM
    elif isinstance(e, KeyboardInterrupt):
        why, code = "interrupted before the run finished", 130
    else:
        return None
    if rank0:
        print(f"forge: {why}\n  continue with: {resume_command(args)}", file=sys.stderr, flush=True)
    return code


def ui_command(recipe_path: str, recipe, overrides: list[str]) -> str:
    """The `forge ui` line that opens this recipe's runs (overrides may have moved its store)."""
    from shlex import quote

    if recipe.tracking.uri:
        return f"forge ui --tracking-uri {quote(recipe.tracking.uri)}"
    return f"forge ui --output {quote(recipe.output)}" if overrides else f"forge ui {quote(recipe_path)}"


def _run_folder(recipe, args, state):
    """Rank 0 locks the output folder and decides what it may do with what it holds (writing
    nothing yet: RunFolder.begin does); the other ranks follow it once rank 0 has begun."""
    from forge.rundir import RunFolder, follower, recipe_fingerprint

    if not state.is_main_process:
        state.wait_for_everyone()
        return follower(recipe.output)
    return RunFolder.claim(recipe.output, recipe_fingerprint(recipe), resume=args.resume, restart=args.restart,
                           overwrite=args.overwrite, allow_changed=args.allow_changed)


def _report_evaluation(ev) -> list:
    """Say on stderr which gates failed, by how much; the failed gates (the summary said where the alias went)."""
    if ev is None:
        return []
    failed = [g for g in ev.gates if not g.passed]
    for g in failed:
        print(f"forge: gate failed: {g.text}", file=sys.stderr)
    return failed


# the subcommands whose arguments live in their own module, and what each says in `forge --help`;
# only the one being run is imported (`forge --help` imports none): a command's first line comes
# before the libraries the others need
LAZY = {"plan": ("forge.plan.command",
                 "plan each stage's compute (FLOPs, memory, chips, layout, hours, cost, energy)"),
        "export": ("forge.export.command",
                   "write a Novella in an export format's layout (Bedrock Custom Model Import by default)"),
        "deploy": ("forge.export.command",
                   "upload an export to S3 and start an Amazon Bedrock Custom Model Import job"),
        "eval": ("forge.eval.command", "evaluate a run's models (or any models) side by side, with gates"),
        "catalog": ("forge.catalog.command", "foundation families: phase checkpoints and curated data"),
        "ui": ("forge.ui", "open the MLflow UI on a run's store"),
        "data": ("forge.data.check_command", "check a data file against a record format (bedrock, openai, openai_rft, ...)"),
        "reward": ("forge.lm.reward_command", "verify a reward source (a Nova Lambda too) on sample rows"),
        "launch": ("forge.launch.command",
                   "write a torchrun, Slurm, Kubernetes or SageMaker job that runs a recipe in the plan's layout"),
        "serve": ("forge.serve.command", "serve the Tinker training API (LoRA, forward_backward, optim_step) "
                  "to the official Tinker SDK")}


def _add_recipe_commands(sub) -> None:
    for name, func, text in [("validate", _validate, "check a recipe without running it"),
                             ("run", _run, "run a recipe's pipeline")]:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("recipe", help="path to a recipe YAML")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. stages[0].optim.lr=1e-4")
        p.set_defaults(func=func)
        if name == "run":
            p.add_argument("--force", action="store_true", help="run stages the plan says cannot fit")
            again = p.add_mutually_exclusive_group()
            again.add_argument("--resume", action="store_true",
                               help="reuse finished stages; continue an interrupted one from its last checkpoint")
            again.add_argument("--restart", action="store_true", help="discard an interrupted run in the output folder")
            again.add_argument("--overwrite", action="store_true", help="replace a finished run in the output folder")
            p.add_argument("--allow-changed", action="store_true",
                           help="with --resume: continue although the recipe, data or base changed")
            p.add_argument("--strict", action="store_true", help="exit 1 when an evaluation gate fails")


def _add_lazy_command(sub, name: str) -> None:
    """The full parser of one LAZY subcommand, from its module."""
    module = importlib.import_module(LAZY[name][0])
    if name in ("export", "deploy"):
        module.add_subcommands(sub)  # both, one module
        return
    p = sub.add_parser(name, help=LAZY[name][1], description=module.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(p)
    p.set_defaults(func=module.run)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `forge` parser; of the LAZY subcommands only the one `argv` names is built in full."""
    argv = sys.argv[1:] if argv is None else argv
    wanted = next((a for a in argv if not a.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="forge", description="Customize language models with your own data.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_recipe_commands(sub)
    done: set[str] = set()
    for name, (module, text) in LAZY.items():
        if name in done:
            continue
        if name == wanted or (module == "forge.export.command" and wanted in ("export", "deploy")):
            _add_lazy_command(sub, name)
            done |= {"export", "deploy"} if module == "forge.export.command" else {name}
        else:
            sub.add_parser(name, help=text)  # listed in `forge --help`; built only when run
    return parser


def opening(args) -> str | None:
    """The first line of a command whose own first line comes late (after torch loads, a model is
    read, a server answers); the other commands print theirs within a second or two."""
    if args.command == "eval":
        if args.recipe:
            return (f"forge eval {args.recipe}: evaluating its run's models "
                    "(the start, each stage's output, the Novella)")
        return f"forge eval: evaluating {args.models or '?'} on the suite {args.suite or '?'}"
    if args.command == "ui":
        where = args.recipe or args.output or args.tracking_uri or "?"
        return f"forge ui: opening the MLflow UI on {where}'s store" if not args.tracking_uri else \
            f"forge ui: opening the MLflow UI on {where}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        first = opening(args)
        if first:
            say(first)
        return args.func(args)
    except ForgeError as e:
        print(scrub(f"forge: error: {e}").replace("\n", "\n  "), file=sys.stderr)  # terminal logs are kept
        return 2
    except BrokenPipeError:  # the reader stopped early (`forge catalog show X | head`): nothing is wrong
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush must not fail again
        except (AttributeError, ValueError, OSError):
            pass  # a stdout without a file descriptor (a test's capture)
        return 0
    except OSError as e:  # the file system refused (read-only, full, gone): the environment, not a bug
        where = f"{e.filename}: " if e.filename else ""
        if e.errno == errno.ELOOP:  # any path a user gave: say what it is, whichever command met it
            print(scrub(f"forge: error: {where}{LOOP}"), file=sys.stderr)
            return 2
        hint = " (after an interrupted run, fix this and add --resume)" if args.command == "run" else ""
        print(scrub(f"forge: error: {where}{e.strerror or e}{hint}"), file=sys.stderr)  # --resume is forge run's
        return 2
    except Exception as e:  # a bug, not bad input: say so plainly, the traceback on request
        loop = re.fullmatch(r"Symlink loop from '(.*)'", str(e)) if isinstance(e, RuntimeError) else None
        if loop:  # Path.resolve() meeting a symbolic link loop (Python 3.11; 3.13 raises OSError ELOOP)
            print(scrub(f"forge: error: {loop.group(1)}: {LOOP}"), file=sys.stderr)
            return 2
        if os.environ.get("FORGE_DEBUG"):
            raise
        print(scrub(f"forge: unexpected error: {type(e).__name__}: {e}\n  (set FORGE_DEBUG=1 for the traceback)"),
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
