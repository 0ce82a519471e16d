"""Folders and files that appear whole or not at all (checkpoints, the Novella, caches, a built base, an
export, a generated or derived data file)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Iterator

from forge.errors import ForgeError


def write_jsonl(path: Path, rows: Iterable[object], ensure_ascii: bool = False) -> Path:
    """Write `rows` as JSON lines at `path` whole or not at all: into a hidden file beside it (named
    with this process's id, so two writers never share one), then one atomic rename; an error
    leaves `path` as it was and removes the partial file. `ensure_ascii` as json.dumps takes it
    (a file whose bytes are fingerprinted keeps the escaping it was written with)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=ensure_ascii) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success it takes `path`'s place by one atomic exchange
    (the old folder, now under the temporary name, is then removed), on error it is removed. A crash
    at any point leaves either the old folder or the new one at `path`, never half of one, and never
    no folder where there was one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        old = path.with_name(path.name + ".old")  # used only where the file system cannot exchange
        shutil.rmtree(old, ignore_errors=True)
        _exchange(tmp, path, old)
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, path)


def out_folder(given: str | Path, say: str, noun: str) -> Path:
    """The real path of an output folder a user named (`say` starts each refusal, `noun` is what
    goes there): never a symbolic link, the current directory or a folder holding it, or a mount
    point, which forge would replace by a rename. The caller checks what may already be there."""
    path = Path(given)
    if path.is_symlink():
        raise ForgeError(f"{say}: a symbolic link (to {os.readlink(path)}); name the folder itself")
    real = path.resolve()
    cwd = Path.cwd().resolve()
    if real == cwd or cwd.is_relative_to(real):
        raise ForgeError(f"{say}: the current directory (or a folder holding it); name a new folder for {noun}")
    if os.path.ismount(real):
        raise ForgeError(f"{say}: a mount point; name a new folder inside it")
    return real


@contextlib.contextmanager
def replace_dir(path: Path, tag: str) -> Iterator[Path]:
    """Yield a new folder to fill, made under a unique hidden name beside `path`
    (`.NAME.TAG-PID-XXXXXXXX`); on success it takes `path`'s place by one atomic exchange and
    what was at `path` (which the caller has checked is its own to replace) is removed. Nothing
    else beside `path` is touched. An error, SIGINT, SIGTERM or SIGHUP while filling removes the
    new folder and leaves `path` as it was; after a SIGKILL, the next call for the same `path` and
    `tag` removes what the killed process left (and puts back an old folder it had moved aside)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.{tag}-"
    _remove_stale(path, prefix)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it owner-only; the folder is for sharing
    try:
        with _signals_raise():
            yield tmp
            if path.exists():
                _exchange(tmp, path, Path(f"{tmp}-old"))  # tmp now holds the old folder
                shutil.rmtree(tmp)
            else:
                os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _exchange(new: Path, path: Path, aside: Path) -> None:
    """Swap two folders atomically (Linux renameat2 RENAME_EXCHANGE); where the file system cannot,
    move `path` aside, `new` in, and the old one to `new`'s name."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(path), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(path))
    os.rename(path, aside)
    os.rename(new, path)
    os.rename(aside, new)


def _remove_stale(path: Path, prefix: str) -> None:
    """Folders `replace_dir` made for `path` in processes that no longer exist."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[A-Za-z0-9_]{8}(-old)?")
    for entry in path.parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if not m or entry.is_symlink() or not entry.is_dir() or _alive(int(m.group(1))):
            continue
        if m.group(2) and not path.exists():  # killed between the two renames: the old one goes back
            os.rename(entry, path)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP, where nothing else handles them, end the process through Python (as
    SystemExit 128+signal) so that cleanup runs; SIGINT already raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    saved = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            saved[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
