"""A catalog phase as a local folder: Hub phases downloaded once with `huggingface_hub` at their
pinned revision into its cache (HF_HUB_CACHE / HF_HOME when the user set them, else
FORGE_HOME/hub), registered folders as they are, a built family's phases from its home."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from forge.base_check import TOKENIZER_FILES
from forge.catalog.entries import CatalogPhase, forge_home, missing
from forge.errors import ForgeError
from forge.scrub import first_line


def hf_cache(variable: str, folder: str) -> Path:
    """A Hugging Face cache: the user's `variable` (HF_HUB_CACHE...) or HF_HOME/`folder`, else
    FORGE_HOME/`folder` (never the home folder's ~/.cache)."""
    if os.environ.get(variable):
        return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / folder
    return forge_home() / folder


def hub_cache() -> Path:
    """Where Hub snapshots go: the user's HF_HUB_CACHE or HF_HOME/hub, else FORGE_HOME/hub."""
    return hf_cache("HF_HUB_CACHE", "hub")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def snapshot(repo: str, revision: str, what: str, log: Callable[[str], None] | None = None,
             download: bool = True) -> Path:
    """The local snapshot of `repo` at `revision` (downloaded when absent, online and `download`)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hub_cache()
    try:  # already in the cache: no network, nothing printed
        return Path(snapshot_download(repo, revision=revision, cache_dir=str(cache), local_files_only=True))
    except LocalEntryNotFoundError:
        if offline() or not download:
            raise ForgeError(f"{what}: hf://{repo}@{revision} is not in the cache {cache} and HF_HUB_OFFLINE is set; "
                             "download it once online (or point HF_HUB_CACHE at a cache that holds it)") from None
    if log is not None:
        log(f"forge: downloading {what} (hf://{repo}@{revision}) once into {cache}; later runs reuse it")
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=str(cache)))
    except LocalEntryNotFoundError:
        raise ForgeError(f"{what}: hf://{repo}@{revision} is not in the cache {cache} and the Hub could not be "
                         "reached; download it once online (or point HF_HUB_CACHE at a cache that holds it)") from None
    except RevisionNotFoundError:
        raise ForgeError(f"{what}: hf://{repo} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise ForgeError(f"{what}: no Hub repository {repo!r} (or it is gated: accept its licence on the Hub "
                         "and log in with `hf auth login`)") from None
    except (HfHubHTTPError, OSError) as e:
        raise ForgeError(f"{what}: downloading hf://{repo}@{revision} failed: {first_line(e, 200)}") from None


def checkpoint(phase: CatalogPhase, log: Callable[[str], None] | None = None, download: bool = True) -> Path:
    """A local folder holding the phase's config, weights and tokenizer (`download`: False, only
    what is already in the cache, else a ForgeError)."""
    if not phase.built:
        raise ForgeError(f"{phase.ref} is not built yet; `forge run` of a recipe using it builds it first")
    if phase.hub is None:
        assert phase.path is not None
        gone = missing(phase)
        if gone:
            raise ForgeError(gone)
        return phase.path
    folder = snapshot(phase.hub, phase.revision or "main", phase.ref, log, download)
    if any((folder / n).is_file() for n in TOKENIZER_FILES) or not phase.tokenizer_from:
        return folder
    return _with_tokenizer(phase, folder, log, download)


def _with_tokenizer(phase: CatalogPhase, folder: Path, log: Callable[[str], None] | None, download: bool) -> Path:
    """A checkpoint branch without tokenizer files (SmolLM3's intermediate checkpoints): a folder of
    links to the snapshot's files plus the family's tokenizer files, under FORGE_HOME."""
    assert phase.tokenizer_from is not None
    tok = snapshot(phase.tokenizer_from["hub"], phase.tokenizer_from["revision"], f"{phase.ref} tokenizer", log,
                   download)
    out = forge_home() / "assembled" / f"{phase.family}@{phase.phase}-{folder.name[:12]}"
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for src in [*folder.iterdir(), *(p for p in tok.iterdir() if p.name.startswith(("tokenizer", "special_tokens")))]:
        link = tmp / src.name
        if not link.exists():
            link.symlink_to(src.resolve())
    tmp.rename(out)
    return out
