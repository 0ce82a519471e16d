"""The output folder of a run, kept usable: one run at a time holds it (an exclusive lock for the
run's lifetime), it records which run it holds (`run.json`: identity, status, fingerprints of the
resolved recipe, the data and the base), and `forge run` decides from that record whether it may
start, continue (`--resume`) or discard (`--restart`, `--overwrite`) what is there.

    run.json  {"run_id", "status": "running" | "finished", "started", "fingerprint": {dotted field: value}}
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
from pathlib import Path

from forge.errors import ForgeError
from forge.scrub import scrub, scrub_dict

LOCK = ".forge.lock"
RUN = "run.json"
# what belongs to one run and goes when it is discarded (data caches and the built base are keyed
# by content and stay; tracking.json stays so a fresh run can mark the old run's RUNNING runs FAILED)
RUN_OUTPUTS = ("stages", "novella", "recipe.resolved.yaml")


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
    """An output folder held by this process (use as a context manager; the lock goes with it)."""

    def __init__(self, out: Path, record: dict, lock_fd: int | None, allow_changed: bool = False):
        self.out, self.record, self._fd, self.allow_changed = Path(out), record, lock_fd, allow_changed

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @classmethod
    def open(cls, out, fingerprint: dict, resume: bool = False, restart: bool = False,
             overwrite: bool = False, allow_changed: bool = False, log=print) -> "RunFolder":
        """Lock `out` and decide what this run may do with what it holds (raises a ForgeError when
        the folder is in use, or holds a run the flags do not say what to do with)."""
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise ForgeError(f"output: {out} is a file, not a folder; choose another output")
        try:
            out.mkdir(parents=True, exist_ok=True)
            fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ForgeError(f"output: cannot write {out}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ForgeError(f"output: {out} is in use by another forge run ({holder}); wait for it to end "
                             "or choose another output") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "started": _now(), "command": scrub(" ".join(sys.argv))}).encode())
            record = cls._decide(out, fingerprint, resume, restart, overwrite, allow_changed, log)
        except BaseException:
            os.close(fd)  # releases the lock
            raise
        folder = cls(out, record, fd, allow_changed)
        folder.fresh = _read_record(out) is None or record["run_id"] != _read_record(out).get("run_id")
        folder._save()
        return folder

    @staticmethod
    def _decide(out: Path, fingerprint: dict, resume, restart, overwrite, allow_changed, log) -> dict:
        previous = _read_record(out)
        if previous is None and any((out / name).exists() for name in RUN_OUTPUTS):
            previous = {"status": "running", "started": "unknown (a folder without run.json)"}
        fresh = {"run_id": uuid.uuid4().hex, "status": "running", "started": _now(), "fingerprint": fingerprint}
        if previous is None:
            return fresh
        finished = previous["status"] == "finished"
        if restart or overwrite:
            if resume:
                raise ForgeError("--resume continues the run in the folder; --restart and --overwrite discard it: "
                                 "give one of them")
            for name in RUN_OUTPUTS:
                target = out / name
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            log(f"discarding the {'finished' if finished else 'interrupted'} run in {out} (started {previous['started']})")
            return fresh
        if not resume:
            if finished:
                raise ForgeError(f"output: {out} holds a finished run (started {previous['started']}); "
                                 "add --overwrite to replace it, or choose another output")
            raise ForgeError(f"output: {out} holds an interrupted run (started {previous['started']}); "
                             "add --resume to continue it, or --restart to discard it and start over")
        if "run_id" not in previous:
            if not allow_changed:
                raise ForgeError(f"output: {out} holds a run without a recorded recipe; --resume cannot check it "
                                 "is the same recipe: add --allow-changed to continue it anyway, or --restart")
            return {**fresh, "run_id": uuid.uuid4().hex}
        diff = changes({k: v for k, v in previous.get("fingerprint", {}).items() if not k.startswith(_INPUT)},
                       fingerprint)
        if diff:
            if not allow_changed:
                raise ForgeError("--resume: the recipe changed since the run started:\n" + "\n".join(diff) +
                                 "\nrun the recipe it started with, add --allow-changed to continue with the "
                                 "changes, or --restart")
            log("forge: warning: --allow-changed: resuming with a changed recipe:\n  " + "\n  ".join(diff))
        inputs = {k: v for k, v in previous.get("fingerprint", {}).items() if k.startswith(_INPUT)}
        return {**previous, "status": "running", "fingerprint": {**fingerprint, **inputs}}

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
        """A fresh run that failed before any work (e.g. an unusable store): leave no record of it,
        so that the folder does not look like an interrupted run."""
        if getattr(self, "fresh", False):
            (self.out / RUN).unlink(missing_ok=True)

    def finish(self) -> None:
        self.record["status"] = "finished"
        self._save()

    def _save(self) -> None:
        tmp = self.out / (RUN + ".tmp")
        tmp.write_text(json.dumps(scrub_dict(self.record), indent=2, default=str))
        os.replace(tmp, self.out / RUN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_INPUT = "inputs."  # fingerprint keys of the data and base, recorded once the pipeline has read them


def follower(out) -> RunFolder:
    """What the other processes of a launch see of the folder rank 0 opened (no lock of their own)."""
    record = _read_record(Path(out))
    if record is None or "run_id" not in record:
        raise ForgeError(f"output: {out}/{RUN} is missing; rank 0 should have written it")
    return RunFolder(Path(out), record, None)


def _read_record(out: Path) -> dict | None:
    path = out / RUN
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ForgeError(f"output: {path} is unreadable ({e}); move it aside, or --restart") from None
    return record if isinstance(record, dict) and "status" in record else None


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        h = json.loads(os.read(fd, 4096).decode() or "{}")
        return f"pid {h.get('pid')} on {h.get('host')}, since {h.get('started')}"
    except (OSError, ValueError):
        return "holder unknown"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
