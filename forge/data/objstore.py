"""Sources in object stores: `s3://bucket/prefix/*.jsonl` (boto3, the standard AWS credential chain
and AWS_ENDPOINT_URL), `gs://` and `az://` through fsspec when its backend (gcsfs, adlfs) is
installed. The objects a path names (one key, every data file under a prefix, or a glob's matches)
are copied once into a local mirror keyed by their ETag, so every format, glob, byte-range shard,
fingerprint (a content hash) and line-numbered error works as for local files; the mirror's path
ends in bucket/key, so an error still names the object. Credentials are never logged or stored.
"""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from forge.errors import ForgeError

SCHEMES = ("s3://", "gs://", "gcs://", "az://", "abfs://")
_WILD = "*?["


def is_remote(path: str | os.PathLike | None) -> bool:
    return isinstance(path, str) and path.startswith(SCHEMES)


def _split(url: str) -> tuple[str, str, str]:
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ForgeError(f"{url}: no bucket in the address (expected {scheme}://BUCKET/KEY-OR-GLOB)")
    if bucket in (".", "..") or "\\" in bucket:  # the bucket is a folder of the local mirror too
        raise ForgeError(f"{url}: {bucket!r} is not a bucket name")
    return scheme, bucket, key


def _unsafe(key: str, prefix: str) -> str | None:
    """Why an object key cannot be a path under a local folder, or None when it can. A key is any
    string: joined onto a folder, `..` segments or a leading `/` would place its copy anywhere, and
    `.`, empty segments and backslashes would make two keys one file (or climb on Windows)."""
    if not key.startswith(prefix):
        return f"is outside the prefix {prefix!r} that was listed"
    if key.startswith("/"):
        return "is absolute (starts with '/')"
    if "\\" in key:
        return "has a backslash"
    if "\0" in key:
        return "has a NUL character"
    segments = key.split("/")
    for bad, why in (("..", "has a '..' segment"), (".", "has a '.' segment"), ("", "has an empty segment ('//')")):
        if bad in segments:
            return why
    return None


def _checked(scheme: str, bucket: str, found: list[tuple[str, str]], prefix: str) -> list[tuple[str, str]]:
    """`found` without folder markers (keys ending in '/': nothing to copy), every other key safe to
    copy under a local folder; one unsafe key refuses them all, before anything is copied."""
    keep = []
    for key, etag in found:
        if key.endswith("/"):
            continue
        why = _unsafe(key, prefix)
        if why is not None:
            raise ForgeError(f"{_name(scheme, bucket, key)}: refused: this object's key {why}, so its copy could "
                             "land outside the local folder (or on another object's copy); nothing was copied")
        keep.append((key, etag))
    return keep


def _name(scheme: str, bucket: str, key: str) -> str:
    """An object's address for a message; a key with control characters quoted so it stays one line."""
    return f"{scheme}://{bucket}/{key}" if key.isprintable() else f"{scheme}://{bucket}/{key!r}"


def _inside(folder: Path, rel: str, name: str) -> Path:
    """`folder / rel`, checked to stay in `folder` (the keys are checked already: this is the last guard)."""
    dest = folder / rel
    if not Path(os.path.normpath(dest)).is_relative_to(os.path.normpath(folder)) or dest == folder:
        raise ForgeError(f"{name}: refused: its copy would land outside {folder}")
    return dest


def _matches(key: str, pattern: str, data_suffixes: tuple[str, ...]) -> bool:
    if any(c in pattern for c in _WILD):
        return fnmatch.fnmatchcase(key, pattern)
    if key == pattern:
        return True
    folder = pattern if pattern.endswith("/") or not pattern else pattern + "/"
    return key.startswith(folder) and key.lower().endswith(data_suffixes)


def _listing(url: str, data_suffixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, etag) of every object the address names, in key order; a key that cannot be copied
    safely under a local folder is a ForgeError naming it (forge.data.objstore._unsafe)."""
    scheme, bucket, pattern = _split(url)
    prefix = pattern
    for i, c in enumerate(pattern):
        if c in _WILD:
            prefix = pattern[:i]
            break
    if scheme == "s3":
        pages = _s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        try:
            found = [(o["Key"], o["ETag"].strip('"')) for page in pages for o in page.get("Contents", [])]
        except Exception as e:  # botocore's errors: no such bucket, access denied, no credentials
            raise ForgeError(f"{url}: cannot list the objects ({type(e).__name__}: {e})") from None
    else:
        fs = _fsspec(scheme, url)
        found = [(p.split("/", 1)[1], str(info.get("etag") or info.get("md5Hash") or info.get("size")))
                 for p, info in fs.find(f"{bucket}/{prefix}", detail=True).items()]
    return _checked(scheme, bucket, sorted((k, e) for k, e in found if _matches(k, pattern, data_suffixes)), prefix)


def _s3():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))


def _fsspec(scheme: str, url: str):
    import fsspec

    try:
        return fsspec.filesystem(scheme)
    except (ImportError, ValueError) as e:
        need = {"gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(scheme, scheme)
        raise ForgeError(f"{url}: reading {scheme}:// needs fsspec's backend: pip install {need} ({e})") from None


def mirror(url: str, root: Path, data_suffixes: tuple[str, ...]) -> tuple[Path, ...]:
    """Local copies of the objects `url` names, under `root/<scheme>/<bucket>/<key>`; an object whose
    ETag is unchanged since it was copied is not fetched again."""
    scheme, bucket, _ = _split(url)
    out = []
    for key, etag in _listing(url, data_suffixes):
        name = _name(scheme, bucket, key)
        local = _inside(root / scheme / bucket, key, name)
        tag = local.with_name(local.name + ".etag")
        try:
            if not (local.is_file() and tag.is_file() and tag.read_text() == etag):
                local.parent.mkdir(parents=True, exist_ok=True)
                part = local.with_name(local.name + ".partial")
                try:
                    _download(scheme, url, bucket, key, part)
                except ForgeError:
                    part.unlink(missing_ok=True)
                    raise
                os.replace(part, local)
                tag.write_text(etag)
        except OSError as e:  # a key that is a file here and a folder there (`a` and `a/b`), a name too long
            raise ForgeError(f"{name}: cannot copy it to {local} ({e.strerror or e})") from None
        out.append(local)
    return tuple(out)


def put_dir(local: Path, url: str, marker: str) -> None:
    """Upload a folder's files under the prefix `url`, `marker` last (its presence says the rest is there)."""
    scheme, bucket, key = _split(url.rstrip("/"))
    files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: (p.name == marker, str(p)))
    for p in files:
        dest = f"{key}/{p.relative_to(local).as_posix()}"
        try:
            if scheme == "s3":
                _s3().upload_file(str(p), bucket, dest)
            else:
                _fsspec(scheme, url).put(str(p), f"{bucket}/{dest}")
        except Exception as e:
            raise ForgeError(f"{scheme}://{bucket}/{dest}: cannot write the object ({type(e).__name__}: {e})") from None


def get_dir(url: str, local: Path, marker: str) -> bool:
    """Download the folder under the prefix `url` into `local` (which must not exist) when its `marker`
    object is there; False when it is not (nothing prepared there yet)."""
    prefix = url.rstrip("/") + "/"
    found = [k for k, _ in _listing(prefix, ("",))]
    _, bucket, key = _split(prefix)
    if f"{key}{marker}" not in found:
        return False
    scheme = url.split("://", 1)[0]
    for k in found:
        name = _name(scheme, bucket, k)
        dest = _inside(local, k[len(key):], name)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ForgeError(f"{name}: cannot copy it to {dest} ({e.strerror or e})") from None
        _download(scheme, url, bucket, k, dest)
    return True


def _download(scheme: str, url: str, bucket: str, key: str, dest: Path) -> None:
    """One object into the file `dest`; a failure is one line naming the object."""
    try:
        if scheme == "s3":
            _s3().download_file(bucket, key, str(dest))
        else:
            _fsspec(scheme, url).get(f"{bucket}/{key}", str(dest))
    except Exception as e:
        raise ForgeError(f"{scheme}://{bucket}/{key}: cannot read the object ({type(e).__name__}: {e})") from None
