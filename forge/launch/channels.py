"""What a SageMaker training job reads, and where: each input of the recipe becomes a channel the
job can reach, or `forge launch` refuses it before anything is written or uploaded.

- a local data file or folder, and a local base folder: uploaded under --s3 as its own channel;
- an `s3://` data source: a channel naming that S3 prefix as it is (nothing copied through this
  machine); the recipe's path becomes the same glob, folder or file inside the channel's folder;
- a `catalog://` base registered on this machine (`forge catalog add`): its folder is the `base`
  channel (the job has no registrations); a Hub phase is downloaded by the job itself at its
  pinned revision, and forge's built families are built by the job's first `forge run`, as on
  any machine;
- gs:// and az:// sources, and a registered base whose folder is gone: refused.

SageMaker copies an S3Prefix channel's objects into /opt/ml/input/data/CHANNEL at their keys
relative to the prefix; a prefix that is one object's key lands as that object's file name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge.errors import ForgeError

ML = "/opt/ml/input/data"
OTHER_STORES = ("gs://", "gcs://", "az://", "abfs://")   # object stores a SageMaker channel cannot name
WILD = "*?["


@dataclass(frozen=True)
class Input:
    """One channel's input: the recipe field the job's override points at `in_job`; `local` is
    uploaded under the job's --s3 prefix, `s3` is an S3 prefix the channel names as it is."""

    field: str
    in_job: str
    local: Path | None = None
    s3: str | None = None


def s3_channel(path: str) -> tuple[str, str]:
    """(the channel's S3 prefix, the path inside its folder) for an s3:// source as forge reads it:
    a glob's matches, a folder's files (a key ending in '/', or whose last part has no suffix), or
    one object."""
    bucket, _, key = path[len("s3://"):].partition("/")
    wild = next((i for i, c in enumerate(key) if c in WILD), None)
    if wild is not None:
        cut = key.rfind("/", 0, wild) + 1
        return f"s3://{bucket}/{key[:cut]}", key[cut:]
    last = key.rstrip("/").rsplit("/", 1)[-1]
    if key and not key.endswith("/") and "." in last:
        return f"s3://{bucket}/{key}", last
    return f"s3://{bucket}/{key.rstrip('/')}/" if key.strip("/") else f"s3://{bucket}/", ""


def _where(channel: str, inside: str) -> str:
    return f"{ML}/{channel}/{inside}" if inside else f"{ML}/{channel}"


def _base(recipe) -> Input | None:
    base = recipe.base
    if not isinstance(base, str):
        return None                      # a scratch model: built from the recipe in the job
    if not base.startswith("catalog://"):
        path = Path(base)
        return Input("base", _where("base", path.name), local=path)
    from forge import catalog

    phase = catalog.resolve(base)
    if phase.origin != "registered":
        return None                      # a Hub phase or a forge-built family: the job fetches or builds it
    folder = catalog.cached(phase)
    if folder is None:
        raise ForgeError(f"base: {base} is registered on this machine at {phase.location}, which holds no "
                         "checkpoint now; a SageMaker job could not reach it (register the folder again)")
    return Input("base", _where("base", folder.name), local=folder)


def job_inputs(recipe) -> dict[str, Input]:
    """Channel name -> the input it carries, for every data source path and the base."""
    out: dict[str, Input] = {}
    for name, src in recipe.data.items():
        if src.path is None:
            continue                     # generated, a Hub dataset or a curated set: the job reads it as here
        field, channel = f"data.{name}.path", f"data-{name}"
        if src.path.startswith(OTHER_STORES):
            raise ForgeError(f"{field} {src.path!r}: a SageMaker job reads S3 channels only; copy the data to "
                             "s3:// and name that path")
        if src.path.startswith("s3://"):
            prefix, inside = s3_channel(src.path)
            out[channel] = Input(field, _where(channel, inside), s3=prefix)
        elif any(ch in src.path for ch in WILD):
            raise ForgeError(f"{field} {src.path!r} is a glob; a SageMaker launch uploads a file or a folder")
        else:
            out[channel] = Input(field, _where(channel, Path(src.path).name), local=Path(src.path))
    base = _base(recipe)
    if base is not None:
        out["base"] = base
    return out


def check_s3_sources(inputs: dict[str, Input], recipe, s3_client) -> None:
    """Every S3 source names at least one object the job's channel would hold (the glob matched as
    forge matches it), else a ForgeError naming the source; asked only with --submit."""
    import fnmatch

    fields = {f"data.{n}.path": s.path for n, s in recipe.data.items()}
    for inp in inputs.values():
        if inp.s3 is None:
            continue
        bucket, _, prefix = inp.s3[len("s3://"):].partition("/")
        pattern = fields[inp.field][len("s3://"):].partition("/")[2]
        pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        wild = any(c in pattern for c in WILD)
        if not any(not wild or fnmatch.fnmatchcase(o["Key"], pattern) for page in pages
                   for o in page.get("Contents", [])):
            raise ForgeError(f"{inp.field} {fields[inp.field]!r}: no objects there; the job's channel would be "
                             "empty (nothing was uploaded)")
