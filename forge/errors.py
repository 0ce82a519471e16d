"""Errors that forge reports to users as a clear message rather than a traceback."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator


class ForgeError(Exception):
    """A problem the user can fix: bad recipe, bad data, missing file. The CLI prints it plainly."""


LOOP = "a symbolic link loop (too many levels of symbolic links); point it at a real file or folder"


def symlink_loop(path: str | Path) -> bool:
    """Whether `path` (or a folder on the way to it) is a loop of symbolic links; Path.exists()
    and is_file() answer False for one, which would read as 'not found'."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    except ValueError:  # a NUL byte: no path at all, reported where it is used
        return False
    return False


def not_safetensors(path: Path, error: Exception) -> ForgeError:
    """The one line for a weights file whose safetensors header does not parse (often a pickle or
    a torch.save archive given the .safetensors name)."""
    head, regular = _head(path)
    kind = {b"PK": " (it looks like a torch.save archive)"}.get(head, " (it looks like a pickle)"
                                                                if head[:1] == b"\x80" else "")
    kind = kind if regular else " (it is not a regular file)"
    return ForgeError(f"{path}: not a safetensors file{kind}: {str(error).splitlines()[0][:120]}; "
                      "re-save the model with save_pretrained(safe_serialization=True)")


def _head(path: Path) -> tuple[bytes, bool]:
    """The first two bytes of `path` and whether it is a regular file; opened without blocking and
    read only when regular, since a FIFO given the weights' name would hold the reader forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b"", True  # unreadable: the caller's error already says why
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b"", False
        return os.read(fd, 2), True
    except OSError:
        return b"", True
    finally:
        os.close(fd)


@contextlib.contextmanager
def aws_errors() -> Iterator[None]:
    """botocore's and boto3's errors as one line each (they never hold the credentials), for every
    command that calls AWS (forge deploy, forge launch --submit); boto3 is imported only here."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    try:
        yield
    except NoCredentialsError:
        raise ForgeError("no AWS credentials found (boto3's standard chain: environment, ~/.aws, SSO, "
                         "instance or task role)") from None
    except NoRegionError:
        raise ForgeError("no AWS region: give --region or set AWS_REGION") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise ForgeError(f"AWS {e.operation_name}: {err.get('Code', '?')}: {err.get('Message', '')}") from None
    except (BotoCoreError, S3UploadFailedError) as e:
        raise ForgeError(f"AWS: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
