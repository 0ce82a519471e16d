"""Where `forge export` may write: a new folder, or (with --overwrite) a folder an earlier forge
export wrote, known by its marker file and holding nothing forge did not put there. Anything else
at --out is refused in one line before any work: another folder, a file, a symbolic link, the
current directory, a mount point, a path inside a forge run folder or a Novella, the source."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from forge.errors import ForgeError
from forge.files import out_folder
from forge.rundir import LOCK, RUN

MANIFEST = "forge-manifest.json"
JOB_REQUEST = "bedrock-import-job.json"
MARKER = ".forge-export"        # {"written_by": "forge export", "manifest_sha256": ...}, written last
NOVELLA = "lineage.json"


def check_destination(out: Path, sources: Iterable[Path], overwrite: bool) -> Path:
    """The real path to write the export to; a ForgeError naming why, when `out` may not be written."""
    say = f"--out {out}"
    real = out_folder(out, say, "the export")
    for marks, what in (((RUN, LOCK), "the forge run folder"), ((NOVELLA,), "the Novella")):
        for folder in (real, *real.parents):
            if any(_exists(folder / m) for m in marks):
                raise ForgeError(f"{say}: inside {what} {folder} (or equal to it); export to a folder outside it")
    for folder in sources:
        if real == folder or folder.is_relative_to(real):
            raise ForgeError(f"{say}: would replace the source {folder}; choose another folder")
    above = next(p for p in (real, *real.parents) if p.exists() or p.is_symlink())
    if not above.is_dir():
        raise ForgeError(f"{say}: {above} is a file, not a folder; forge export never replaces a file")
    if above == real:
        problem = not_an_export(real)
        if problem:
            raise ForgeError(f"{say}: a folder not written by forge export ({problem}); name a new folder")
        if not overwrite:
            raise ForgeError(f"{say}: holds an earlier forge export; add --overwrite to replace it")
    return real


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # unreadable: not one forge can tell
        return False


def not_an_export(folder: Path) -> str | None:
    """None if `folder` is an export forge wrote (its marker matches the manifest, and it holds only
    the files the manifest lists, the manifest, the marker and the job request); else why not."""
    marker = folder / MARKER
    if marker.is_symlink() or not marker.is_file():
        return f"no {MARKER} marker"
    try:
        mark = json.loads(marker.read_text())
        manifest = json.loads((folder / MANIFEST).read_text())
        files = set(manifest["files"])
        want = mark["manifest_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARKER} marker or {MANIFEST} is unreadable"
    if manifest_sha256(folder) != want:
        return f"its {MARKER} marker does not match {MANIFEST}"
    allowed = files | {MANIFEST, MARKER, JOB_REQUEST}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name not in allowed or entry.is_symlink() or not entry.is_file():
            return f"it holds {entry.name}, which forge export did not write"
    return None


def manifest_sha256(folder: Path) -> str:
    return hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()


def write_marker(folder: Path) -> None:
    """The marker that lets a later `forge export --overwrite` replace this folder (written last)."""
    mark = {"written_by": "forge export", "manifest_sha256": manifest_sha256(folder)}
    (folder / MARKER).write_text(json.dumps(mark) + "\n")
