"""Run a script `forge launch` wrote with every program it starts replaced by a stub: torchrun
(the stub writes its argv, NUL-separated, to a file), srun (runs the command it is given),
scontrol, pip and python (print a host name or 0). What the script ran is then known word for
word, and anything else it ran (a `touch` smuggled in through a name) leaves a file behind."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

STUBS = {
    "torchrun": '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$FORGE_TEST_ARGV"\n',
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/bash\necho node-0\n",
    "pip": "#!/bin/bash\nexit 0\n",
    "python": "#!/bin/bash\necho 0\n",
}


def stub_dir(where: Path) -> Path:
    stubs = where / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    return stubs


def bash_n(text: str, where: Path) -> subprocess.CompletedProcess:
    """`bash -n` on a script's text (written as bytes: the name may hold any character)."""
    script = where / "check.sh"
    script.write_bytes(text.encode())
    return subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)


def run_script(text: str, where: Path, env: dict[str, str] | None = None) -> list[str]:
    """Run the script in a new empty folder under `where` with the stubs first on PATH; the words
    torchrun was given. The script must leave nothing behind in that folder."""
    stubs = stub_dir(where)
    cwd = Path(tempfile.mkdtemp(prefix="cwd-", dir=where))  # new each run: no leftover blames the next run
    script = where / "job.sh"
    script.write_bytes(text.encode())
    argv = where / "argv"
    argv.unlink(missing_ok=True)
    full = {"PATH": f"{stubs}{os.pathsep}/usr/bin{os.pathsep}/bin", "FORGE_TEST_ARGV": str(argv),
            "SLURM_NNODES": "2", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node-[0-1]", **(env or {})}
    done = subprocess.run(["bash", str(script)], cwd=cwd, env=full, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert sorted(p.name for p in cwd.iterdir()) == [], "the script ran something it was not told to"
    return [w.decode() for w in argv.read_bytes().split(b"\0")[:-1]]
