"""How this process was launched, as words that launch it again (so that a resume hint printed
under torchrun runs under torchrun, with the same processes and rendezvous), and whether an error
from a collective means that another rank died."""
from __future__ import annotations

import os
from pathlib import Path

# the messages a collective raises on a rank whose peer died (gloo's tcp transport; the c10d store)
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket closed",
             "connection was reset", "remote worker crashing")
TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def launcher_words(cmdline: list[str] | None = None) -> list[str] | None:
    """The launcher and its options that started this process, up to and including the script it
    runs (`torchrun --nproc_per_node 2 -m forge.cli`), from the parent process's command line;
    None when this process was not started by torchrun. Under a torch launcher whose command line
    cannot be read, a torchrun line built from what torchrun puts in the environment."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and cmdline is None:
        return None
    argv = _parent_argv() if cmdline is None else cmdline
    words = _from_torchrun_argv(argv) if argv else None
    if words is None and "TORCHELASTIC_RUN_ID" in os.environ:
        return _from_environment()
    return words


def _parent_argv() -> list[str] | None:
    """The parent's argv (Linux /proc): torchrun's agent starts each rank as its child."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return [os.fsdecode(w) for w in raw.split(b"\0")[:-1]] or None


def _from_torchrun_argv(argv: list[str]) -> list[str] | None:
    """`argv` cut after the script torchrun runs, with torchrun's own options kept word for word
    (torchrun's parser tells where its options end); None if `argv` is no torchrun command line."""
    at = next((i for i, w in enumerate(argv) if Path(w).name == "torchrun"), None)
    if at is not None:
        launcher, rest = ["torchrun" if _on_path(argv[at]) else argv[at]], argv[at + 1:]
    else:
        at = next((i for i in range(len(argv) - 1) if argv[i] == "-m" and argv[i + 1] in TORCH_LAUNCHERS), None)
        if at is None:
            return None
        launcher, rest = argv[:at + 2], argv[at + 2:]
    from torch.distributed.run import get_args_parser

    try:
        ns = get_args_parser().parse_args(rest)
    except SystemExit:  # not a command line torchrun accepts: nothing to repeat
        return None
    end = len(rest) - len(ns.training_script_args)
    if end < 1 or rest[end - 1] != ns.training_script:
        return None
    return [*launcher, *rest[:end]]


def _on_path(path: str) -> bool:
    import shutil

    found = shutil.which("torchrun")
    return found is not None and Path(found).resolve() == Path(path).resolve()


def _from_environment() -> list[str]:
    """A torchrun line from the variables torchrun sets in each rank (the processes per node and
    the number of nodes; a multi-node rendezvous is not in the environment)."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = max(1, int(os.environ.get("WORLD_SIZE", str(per_node))) // max(per_node, 1))
    return ["torchrun", "--nnodes", str(nodes), "--nproc_per_node", str(per_node), "-m", "forge.cli"]


def peer_failure(error: BaseException, world_size: int) -> str | None:
    """The one-line reason, when `error` (or what it was raised from) is a collective failing
    because another rank of a multi-process run died; None otherwise."""
    if world_size < 2:
        return None
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if isinstance(e, RuntimeError) and (_is_dist_error(e) or any(p in text for p in PEER_LOST)):
            return _first_sentence(text)
        e = e.__cause__ or e.__context__
    return None


def _is_dist_error(e: BaseException) -> bool:
    import torch.distributed as dist

    kind = getattr(dist, "DistError", None)
    return kind is not None and isinstance(e, kind)


def _first_sentence(text: str) -> str:
    """gloo's message without its source location (`[.../pair.cc:553] `) and the advice after it."""
    line = text.strip().splitlines()[0] if text.strip() else "a collective failed"
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return line.split(". ", 1)[0].rstrip(".")[:200]
