"""Where `forge launch` may write a job: a new or empty folder, or one an earlier forge launch
wrote (its marker lists each file with its sha256, and the folder holds those files unchanged and
nothing else). Anything else at --out is refused in one line before anything is written: a user's
own or edited file, a symbolic link (the folder, or any entry in it), an empty name, the current
directory, a mount point, a file. The job is filled in a new folder beside it and takes its place
by one rename (forge.files.replace_dir): a crash leaves the old job or the new one, never a mix."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from forge.errors import ForgeError
from forge.files import out_folder, replace_dir

MARKER = ".forge-launch"   # {"written_by": "forge launch", "files": {name: sha256}}
EXECUTABLE = (".sh", ".sbatch")


def check_out(given: str) -> Path:
    """The real folder to write the job to; a ForgeError naming why when --out may not be written."""
    say = f"--out {given!r}"
    if not given.strip():
        raise ForgeError(f"{say}: an empty name (it would be the current directory); name a folder for the job")
    if "\0" in given:
        raise ForgeError(f"{say}: holds a NUL byte (\\0)")
    real = out_folder(given, say, "the job")
    above = next(p for p in (real, *real.parents) if p.exists() or p.is_symlink())
    if not above.is_dir():
        raise ForgeError(f"{say}: {above} is a file, not a folder; forge launch never replaces a file")
    if above == real:
        problem = not_a_job(real)
        if problem:
            raise ForgeError(f"{say}: a folder not written by forge launch ({problem}); name a new or empty folder")
    return real


def not_a_job(folder: Path) -> str | None:
    """None if `folder` is empty or holds exactly the files an earlier forge launch wrote there,
    unchanged; else why not."""
    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    if not entries:
        return None
    marker = folder / MARKER
    if marker.is_symlink() or not marker.is_file():
        names = [e.name for e in entries]
        return f"it holds {names[0]}, which forge launch did not write"
    try:
        files = json.loads(marker.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError(type(files).__name__)
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARKER} marker is unreadable"
    for entry in entries:
        if entry.name == MARKER:
            continue
        if entry.name not in files or entry.is_symlink() or not entry.is_file(follow_symlinks=False):
            return f"it holds {entry.name}, which forge launch did not write"
        if _sha256(Path(entry.path).read_bytes()) != files[entry.name]:
            return f"{entry.name} changed since forge launch wrote it"
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _encode(name: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: a file name that is not UTF-8
        bad = e.object[max(0, e.start - 40):e.end + 10]
        raise ForgeError(f"{name}: cannot be written as UTF-8 (a name holds {bad!r}); rename the file") from None


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    if path.name.endswith(EXECUTABLE):
        path.chmod(0o755)


def write_job(folder: Path, files: dict[str, str]) -> None:
    """The job's files and the marker, replacing `folder` (checked by check_out) whole."""
    encoded = {name: _encode(name, text) for name, text in files.items()}  # every refusal before any write
    with replace_dir(folder, "launch") as tmp:
        for name, data in encoded.items():
            _write(tmp / name, data)
        mark = {"written_by": "forge launch", "files": {n: _sha256(d) for n, d in encoded.items()}}
        (tmp / MARKER).write_text(json.dumps(mark, indent=1) + "\n")
