"""A throwaway virtualenv with transformers 4.51.3 (Bedrock's runtime version) from PyPI, for the
slow test that loads an export there. torch is not downloaded again: the running interpreter's torch
(and what it needs) is linked in after the venv's own packages, so the venv's versions win."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

TRANSFORMERS = "4.51.3"


def _site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3*/site-packages"))


def _top_levels(dist: metadata.Distribution) -> set[str]:
    """Top-level names a distribution installed (packages, modules, its .dist-info)."""
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    return names


def link_distribution(name: str, env: Path, seen: set[str] | None = None) -> None:
    """Symlink `name` and its requirements (recursively) from this interpreter into `env`'s
    torch-link folder, skipping what the venv already installed itself."""
    seen = seen if seen is not None else set()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    seen.add(key)
    site, links = _site_packages(env), env / "linked"
    installed = {re.sub(r"[-_.]+", "-", p.name.split("-")[0]).lower() for p in site.glob("*.dist-info")}
    if key in installed:  # the venv has its own (a requirement of transformers 4.51.3)
        return
    dist = metadata.distribution(name)
    links.mkdir(exist_ok=True)
    own = {p.name.lower() for p in site.iterdir()}
    origin = Path(dist.locate_file(""))
    for top in _top_levels(dist):
        if top.lower() not in own and not (links / top).exists():
            (links / top).symlink_to(origin / top)
    for req in dist.requires or []:
        r = Requirement(req)
        if r.marker is None or r.marker.evaluate({"extra": ""}):
            try:
                link_distribution(r.name, env, seen)
            except metadata.PackageNotFoundError:
                pass


def build(env: Path, timeout: float = 240) -> Path:
    """Create the venv, pip install transformers==4.51.3, link torch; return its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    cmd = [str(python), "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check",
           f"transformers=={TRANSFORMERS}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PIP_NO_INPUT": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"pip install transformers=={TRANSFORMERS} failed: {out.stderr.strip()[-500:]}")
    link_distribution("torch", env)
    (_site_packages(env) / "zz_forge_linked.pth").write_text(str(env / "linked") + "\n")
    return python


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
