"""The output folder of a run, kept usable: one run at a time holds it (an exclusive lock for the
run's lifetime), it records which run it holds (`run.json`: identity, status, fingerprints of the
resolved recipe, the data and the base), and `forge run` decides from that record whether it may
start, continue (`--resume`, an interrupted run) or discard (`--restart` an interrupted run,
`--overwrite` a finished one) what is there. It discards only what forge wrote: the run's outputs
in a folder whose run.json forge wrote; any other folder is refused, naming what is there.
`RunLayout` says where each thing forge writes lives in the folder; every module asks it.

    run.json  {"written_by": "forge", "run_id", "status": "running" | "finished", "started",
               "fingerprint": {dotted field: value}}
"""
from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from forge.errors import ForgeError
from forge.runlog import LOG_FILE
from forge.scrub import scrub, scrub_dict

# ------------------------------------------------------------------------------ the folder's names
# Every fixed name in a run's output folder, spelled once here; RunLayout joins them. forge.train,
# given a stage's folder and never the run's, joins FINAL and CHECKPOINTS to it itself.
LOCK = ".forge.lock"                # who holds the folder (forge.rundir)
RUN = "run.json"                    # which run it holds
RESOLVED = "recipe.resolved.yaml"   # the recipe as the run read it
TRACKING = "tracking.json"          # the run's MLflow run ids (forge.track.runs)
MLFLOW_DB = "mlflow.db"             # the recipe's default tracking store
STAGES = "stages"                   # stages/NAME: a stage's folder
FINAL = "final"                     # stages/NAME/final: the stage's output checkpoint
MERGED = "merged"                   # stages/NAME/merged: that output merged back toward the input (merge:)
CHECKPOINTS = "checkpoints"         # stages/NAME/checkpoints/step-N: resume points (forge.train.session)
NOVELLA = "novella"                 # the pipeline's final model
DATA = "data"                       # generated, cleaned, augmented data and token caches, keyed by content
EVAL_CACHE = "eval/measured.json"   # suite figures per model (forge.eval.stage_eval)
LOCAL_RATE = "local-rate.json"      # the planner's measured step rates (forge.plan.local_rate)
CALIBRATION = "calibration.yaml"    # a planner calibration (forge plan --calibrate)
FOUNDATION = "foundation"           # the foundation pipeline's published family
# what belongs to one run and goes when it is discarded (data caches and the built base are keyed
# by content and stay; tracking.json stays so a fresh run can mark the old run's RUNNING runs FAILED)
RUN_OUTPUTS = (STAGES, NOVELLA, RESOLVED)


@dataclass(frozen=True)
class RunLayout:
    """Where each thing forge writes lives in a run's output folder `out` (paths only: reads nothing)."""

    out: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))

    @property
    def lock(self) -> Path:
        return self.out / LOCK

    @property
    def run_record(self) -> Path:
        return self.out / RUN

    @property
    def resolved_recipe(self) -> Path:
        return self.out / RESOLVED

    @property
    def tracking(self) -> Path:
        return self.out / TRACKING

    @property
    def mlflow_db(self) -> Path:
        return self.out / MLFLOW_DB

    @property
    def log(self) -> Path:
        return self.out / LOG_FILE

    @property
    def stages(self) -> Path:
        return self.out / STAGES

    def stage(self, name: str) -> Path:
        return self.stages / name

    def stage_final(self, name: str) -> Path:
        return self.stage(name) / FINAL

    def stage_merged(self, name: str) -> Path:
        return self.stage(name) / MERGED

    def stage_checkpoints(self, name: str) -> Path:
        return self.stage(name) / CHECKPOINTS

    @property
    def novella(self) -> Path:
        return self.out / NOVELLA

    @property
    def data(self) -> Path:
        return self.out / DATA

    def scratch_base(self, key: str) -> Path:
        """A from-scratch base, named by forge.scratch.scratch_key (kept across runs, like the data)."""
        return self.out / f"base-{key}"

    @property
    def eval_cache(self) -> Path:
        return self.out / EVAL_CACHE

    @property
    def local_rate(self) -> Path:
        return self.out / LOCAL_RATE

    @property
    def calibration(self) -> Path:
        return self.out / CALIBRATION

    @property
    def foundation(self) -> Path:
        return self.out / FOUNDATION

    def export(self, fmt: str) -> Path:
        """An export the pipeline writes: beside the folder, never in it (forge export refuses a
        destination inside a run folder)."""
        return self.out.with_name(f"{self.out.name}-{fmt}")

    def run_outputs(self) -> tuple[Path, ...]:
        return tuple(self.out / name for name in RUN_OUTPUTS)


def recipe_fingerprint(recipe) -> dict:
    """The resolved recipe as {dotted field (override syntax): value}, the output folder aside, its
    strings scrubbed by forge.scrub as run.json stores them (so a resume compares like with like)."""
    return scrub_dict({k: v for k, v in _flatten(recipe.model_dump(mode="json")).items() if k != "output"})


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    if isinstance(tree, list):
        out = {}
        for i, v in enumerate(tree):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: tree}


def base_fingerprint(path: Path) -> str:
    """sha256 over a base folder's file names and bytes (weights beyond 64 MB by size and mtime,
    so that a resume does not reread a large model)."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(path).as_posix()}\0{st.st_size}\0".encode())
        if st.st_size > 64 << 20:
            h.update(str(st.st_mtime_ns).encode())
            continue
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def changes(old: dict, new: dict) -> list[str]:
    """'field: old -> new' for each dotted field that differs."""
    missing = object()
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            out.append(f"{key}: {'(absent)' if a is missing else a} -> {'(absent)' if b is missing else b}")
    return out


class RunFolder:
    """An output folder held by this process (use as a context manager; the lock goes with it).

    `claim` locks the folder and decides, refusing before anything is written; `begin` then does
    what was decided (discards the old run's outputs, writes run.json). `open` does both."""

    def __init__(self, out: Path, record: dict, lock_fd: int | None, allow_changed: bool = False):
        self.out, self.record, self._fd, self.allow_changed = Path(out), record, lock_fd, allow_changed
        self.finished_before = False  # --resume of a finished run: nothing to do, nothing changes
        self.fresh = False            # a new run (not a continued one)
        self._discard: tuple[str, str] | None = None  # ("finished" | "interrupted", started) of a run to discard
        self.changed: list[str] = []  # --resume --allow-changed: the recipe's changes, said when the run begins

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.out)

    @classmethod
    def open(cls, out, fingerprint: dict, resume: bool = False, restart: bool = False,
             overwrite: bool = False, allow_changed: bool = False, log=print) -> RunFolder:
        """`claim` and `begin` in one."""
        folder = cls.claim(out, fingerprint, resume, restart, overwrite, allow_changed)
        try:
            return folder.begin(log)
        except BaseException:
            folder.close()
            raise

    @classmethod
    def claim(cls, out, fingerprint: dict, resume: bool = False, restart: bool = False,
              overwrite: bool = False, allow_changed: bool = False) -> RunFolder:
        """Lock `out` and decide what this run may do with what it holds, writing nothing but the
        lock (raises a ForgeError when the folder is in use, is not forge's, or holds a run the
        flags do not say what to do with)."""
        out = Path(out)
        if out.is_dir():
            check_forge_folder(out)  # a folder forge did not make gets no lock file either
        fd = lock_folder(out)
        try:
            write_holder(fd)
            folder = cls(out, {}, fd, allow_changed)
            folder._decide(fingerprint, resume, restart, overwrite)
        except BaseException:
            os.close(fd)  # releases the lock
            raise
        return folder

    def begin(self, log=print) -> RunFolder:
        """Do what `claim` decided: discard the earlier run's outputs (only forge's: RUN_OUTPUTS of
        a folder whose run.json forge wrote), record this run in run.json."""
        if self.finished_before:
            return self
        if self._discard is not None:
            for target in self.layout.run_outputs():
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            log(f"discarding the {self._discard[0]} run in {self.out} (started {self._discard[1]})")
            self._discard = None
        if self.changed:
            log("forge: warning: --allow-changed: resuming with a changed recipe:\n  " + "\n  ".join(self.changed))
        previous = _read_record(self.out)
        self.fresh = previous is None or previous.get("run_id") != self.record["run_id"]
        self._save()
        return self

    def _decide(self, fingerprint: dict, resume: bool, restart: bool, overwrite: bool) -> None:
        out = self.out
        previous = check_forge_folder(out)
        fresh = {"written_by": "forge", "run_id": uuid.uuid4().hex, "status": "running", "started": _now(),
                 "fingerprint": fingerprint}
        self.record = fresh
        if previous is None:
            return
        started, finished = previous["started"], previous["status"] == "finished"
        if resume and (restart or overwrite):
            raise ForgeError("--resume continues the run in the folder; --restart and --overwrite discard it: "
                             "give one of them")
        if finished and restart:
            raise ForgeError(f"output: {out} holds a finished run (started {started}); --restart discards an "
                             "interrupted run only: add --overwrite to replace the finished one, or choose another output")
        if restart or overwrite:
            self._discard = ("finished" if finished else "interrupted", started)
            return
        if finished and resume:
            self.record, self.finished_before = previous, True
            return
        if not resume:
            if finished:
                raise ForgeError(f"output: {out} holds a finished run (started {started}); "
                                 "add --overwrite to replace it, or choose another output")
            raise ForgeError(f"output: {out} holds an interrupted run (started {started}); "
                             "add --resume to continue it, or --restart to discard it and start over")
        diff = changes({k: v for k, v in previous.get("fingerprint", {}).items() if not k.startswith(_INPUT)},
                       fingerprint)
        if diff:
            if not self.allow_changed:
                raise ForgeError("--resume: the recipe changed since the run started:\n" + "\n".join(diff) +
                                 "\nrun the recipe it started with, add --allow-changed to continue with the "
                                 "changes, or --restart to discard the run and start over")
            self.changed = diff
        inputs = {k: v for k, v in previous.get("fingerprint", {}).items() if k.startswith(_INPUT)}
        self.record = {**previous, "written_by": "forge", "status": "running",
                       "fingerprint": {**fingerprint, **inputs}}

    def check_inputs(self, fingerprints: dict[str, str]) -> None:
        """Record the data and base fingerprints ({'data.<name>' | 'base': sha256}); when the run
        already recorded some (a resume), they must be the same unless --allow-changed."""
        new = {f"{_INPUT}{k}": v for k, v in fingerprints.items()}
        old = {k: v for k, v in self.record["fingerprint"].items() if k.startswith(_INPUT)}
        diff = changes(old, new) if old else []
        if diff and not self.allow_changed:
            names = ", ".join(line.split(":")[0].removeprefix(_INPUT) for line in diff)
            raise ForgeError(f"--resume: the inputs changed since the run started: {names} (sha256 differs); "
                             "restore them, add --allow-changed, or --restart")
        self.record["fingerprint"] = {**{k: v for k, v in self.record["fingerprint"].items()
                                         if not k.startswith(_INPUT)}, **new}
        self._save()

    def forget(self) -> None:
        """A fresh run that failed before any stage started (an unusable store, a data error):
        leave no record of it (run.json, the resolved recipe), so that the folder does not look
        like an interrupted run and starts again without --resume or --restart."""
        if self.fresh:
            for path in (self.layout.run_record, self.layout.resolved_recipe):
                path.unlink(missing_ok=True)

    def resumable(self) -> bool:
        """Whether the folder holds anything a --resume continues from: a stage's final output or
        a checkpoint (forge.train.checkpoint's `stages/NAME/checkpoints/step-N`)."""
        stages = self.layout.stages
        return any(stages.glob(f"*/{FINAL}")) or any(stages.glob(f"*/{CHECKPOINTS}/step-*[0-9]"))

    def finish(self) -> None:
        self.record["status"] = "finished"
        self._save()

    def _save(self) -> None:
        path = self.layout.run_record
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(scrub_dict(self.record), indent=2, default=str))
        os.replace(tmp, path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_INPUT = "inputs."  # fingerprint keys of the data and base, recorded once the pipeline has read them


def follower(out) -> RunFolder:
    """What the other processes of a launch see of the folder rank 0 opened (no lock of their own)."""
    record = _read_record(Path(out))
    if record is None or "run_id" not in record:
        raise ForgeError(f"output: {RunLayout(out).run_record} is missing; rank 0 should have written it")
    folder = RunFolder(Path(out), record, None)
    folder.finished_before = record.get("status") == "finished"  # rank 0 began no run: --resume of a finished one
    return folder


def lock_folder(out: Path) -> int:
    """Create `out` if needed and take its lock (exclusive, held until the returned descriptor is
    closed); a ForgeError naming the holder's pid when another process holds it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ForgeError(f"output: {out} is a file, not a folder; choose another output")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(RunLayout(out).lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ForgeError(f"output: cannot write {out}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _read_holder(fd)
        os.close(fd)
        raise ForgeError(f"output: {out} is in use by another forge run ({who}); wait for it to end "
                         "or choose another output") from None
    return fd


def check_forge_folder(out: Path) -> dict | None:
    """The folder's run.json record (None: none, and nothing of a run either); a ForgeError naming
    what is there when the folder holds a run's outputs without a run.json, or a run.json forge
    did not write. Reads only."""
    previous = _read_record(out)
    if previous is None:
        found = sorted(f"{p.name}/" if p.is_dir() else p.name for p in RunLayout(out).run_outputs() if p.exists())
        if found:
            raise ForgeError(f"output: {out} is not a forge run folder (no {RUN}) but holds {', '.join(found)}; "
                             "forge discards only what it wrote: choose another output, or move them aside")
    elif not _is_forge_record(previous):
        raise ForgeError(f"output: {RunLayout(out).run_record} was not written by forge; forge discards only what it wrote: "
                         "choose another output, or move it aside")
    return previous


def write_holder(fd: int) -> None:
    """Say in the lock file who holds it (pid, host, since when, the command line)."""
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": _now(), "command": scrub(" ".join(sys.argv))}).encode())


def holder(out: Path) -> str | None:
    """Who holds `out`'s lock ('pid N on HOST, since T'), or None when no process does; takes and
    writes nothing."""
    try:
        fd = os.open(RunLayout(out).lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd)
    finally:
        os.close(fd)
    return None


def _is_forge_record(record: dict) -> bool:
    """run.json as forge writes it (forge before `written_by` wrote the same fields without it)."""
    legacy = {"run_id", "status", "started", "fingerprint"} <= set(record)
    return (record.get("written_by") == "forge" or legacy) and record.get("status") in ("running", "finished")


def _read_record(out: Path) -> dict | None:
    path = RunLayout(out).run_record
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ForgeError(f"output: {path} is unreadable ({e}); move it aside, or choose another output") from None
    return record if isinstance(record, dict) else {}  # {}: a run.json forge did not write


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        h = json.loads(os.read(fd, 4096).decode() or "{}")
        return f"pid {h.get('pid')} on {h.get('host')}, since {h.get('started')}"
    except (OSError, ValueError):
        return "holder unknown"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
