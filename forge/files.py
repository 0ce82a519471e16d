"""Folders that appear whole or not at all (checkpoints, the Novella, caches, a built base)."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success it replaces `path` by renames, on error it is
    removed. A crash at any point leaves either the old folder or the new one, never half of one."""
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
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)
