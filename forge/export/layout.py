"""`forge export`: write a checkpoint in the Hugging Face layout, with what its format adds
(forge.export.formats: checks, files, a chat template, the import-job request).

config.json for transformers 4.51.3, safetensors shards in bf16/fp16 with an index, the tokenizer
files with the chat template inline, generation_config.json, MODEL_CARD.md, the format's own files,
forge-manifest.json (sha256 of every file, lineage) and, given a role and an S3 URI, the import-job
request. Every check runs before anything is written (where --out may be:
forge.export.destination), and the folder appears whole or not at all, its marker file written last.
"""
from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import torch

import forge
from forge.errors import ForgeError
from forge.export import bedrock, compat
from forge.export.card import model_card
from forge.export.destination import JOB_REQUEST, MANIFEST, MARKER, check_destination, write_marker
from forge.export.formats import Format, Planned, row
from forge.export.shapes import check_config
from forge.export.source import HEAD, Source, source_tensors, tensor_specs, untied_head
from forge.files import replace_dir
from forge.lineage import Lineage
from forge.progress import counted, phase
from forge.scrub import scrub_dict

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "spiece.model")


@dataclass
class ExportOptions:
    format: str = "bedrock"            # a row of forge.export.formats.FORMATS
    dtype: str = "bf16"                # bf16 | fp16
    max_shard_bytes: int = 5 * 1024**3
    model_name: str | None = None      # importedModelName (default: the recipe's name)
    job_name: str | None = None
    role_arn: str | None = None        # with s3_uri: write the import-job request now
    s3_uri: str | None = None
    chat_template: str | None = None   # replaces the model's (or the default, if it has none)
    verify: bool = False
    overwrite: bool = False            # replace an earlier forge export at `out` (nothing else, ever)


def export(src: Source, out: Path, opts: ExportOptions, log=print) -> dict:
    """Check, then write the export to `out`; return the manifest."""
    fmt = row(opts.format)
    if opts.dtype not in TORCH:
        raise ForgeError(f"--dtype {opts.dtype!r}: expected one of {', '.join(TORCH)}")
    real = check_destination(Path(out), {src.folder, src.model_folder}, opts.overwrite)
    planned = _plan(src, opts, fmt)
    found = fmt.problems(planned)
    if not planned.tokenizer.get("tokenizer_class"):
        found.append("no tokenizer_config.json with a tokenizer_class (the export ships the tokenizer files)")
    if found:
        raise ForgeError("cannot export: " + "; ".join(found))
    if not (planned.tokenizer_folder / "tokenizer.json").is_file():
        raise ForgeError(f"{planned.tokenizer_folder}: no tokenizer.json (the fast tokenizer file the runtime loads)")
    if opts.role_arn and opts.s3_uri:  # the job request is checked now too, then rebuilt with the manifest hash
        fmt.job_request(_names(planned), opts.role_arn, opts.s3_uri, src.lineage, {})

    try:
        manifest, request = _write(real, opts, fmt, planned, log)
    except OSError as e:  # a full disk, a folder gone read-only: the old export (if any) is as it was
        where = f"{e.filename}: " if e.filename else ""
        kept = "the earlier export there is unchanged" if real.exists() else "nothing was written"
        raise ForgeError(f"--out {out}: cannot write the export: {where}{e.strerror or e} ({kept})") from None
    log(f"exported {src.spec} -> {out} ({opts.format}, {opts.dtype}, {len(manifest['files'])} files, "
        f"{manifest['weight_bytes'] / 1e6:.1f} MB of weights)")
    _track(src, Path(out), manifest, request, log)
    return manifest


def _plan(src: Source, opts: ExportOptions, fmt: Format) -> Planned:
    """Everything read and translated from the source, before any check of the format's."""
    config = _read_json(src.model_folder / "config.json")
    specs = tensor_specs(src.model_folder)  # a LoRA merge keeps the base's tensors and shapes (an untied head: below)
    check_config(config, specs, src.model_folder / "config.json")
    config_out, config_changes = compat.translate_config(config, opts.dtype)
    head_from = untied_head(src)
    if head_from:  # the merge writes the adapted head last, beside the embedding it was tied to
        specs.pop(HEAD, None)
        specs[HEAD] = specs[head_from]
        config_out["tie_word_embeddings"] = False
        config_changes["set"] = {"tie_word_embeddings": False}
    tok_folder = src.folder if (src.folder / "tokenizer_config.json").is_file() else src.model_folder
    tok_config = _read_json(tok_folder / "tokenizer_config.json")
    template, template_from = _chat_template(tok_folder, tok_config, opts, fmt)
    tok_out, tok_changes = compat.translate_tokenizer_config(tok_config or {}, template)
    sizes = {n: _numel(s) * (TORCH[opts.dtype].itemsize if dt_.is_floating_point else dt_.itemsize)
             for n, (dt_, s) in specs.items()}
    name = opts.model_name or bedrock.model_name(src.lineage.name if src.lineage else src.model_folder.name)
    return Planned(src, opts.dtype, name, opts.job_name or bedrock.job_name(name), sizes, config_out, config_changes,
                   tok_folder, tok_out if tok_config else {}, tok_changes, template_from)


def _names(planned: Planned) -> dict[str, str]:
    return {"importedModelName": planned.name, "jobName": planned.job}


def _write(real: Path, opts: ExportOptions, fmt: Format, planned: Planned, log) -> tuple[dict, dict | None]:
    """The export written whole at `real` (replacing an earlier export there), its marker last:
    the manifest and the job request (or None)."""
    src, config_out = planned.source, planned.config
    with replace_dir(real, "forge-export") as tmp:
        n_params = _write_weights(src, tmp, opts, planned.sizes)
        (tmp / "config.json").write_text(json.dumps(config_out, indent=2) + "\n")
        (tmp / "tokenizer_config.json").write_text(json.dumps(planned.tokenizer, indent=2) + "\n")
        for f in TOKENIZER_FILES:
            if (planned.tokenizer_folder / f).is_file():
                shutil.copy2(planned.tokenizer_folder / f, tmp / f)
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(src, config_out), indent=2) + "\n")
        info = {"format": fmt.name, "dtype": opts.dtype, "architecture": (config_out.get("architectures") or ["?"])[0],
                "parameters": n_params, "weight_bytes": planned.weight_bytes, "chat_template": planned.template_from}
        (tmp / "MODEL_CARD.md").write_text(model_card(planned.name, src.lineage, config_out, info, fmt))
        for name, text in fmt.files(planned).items():
            _own_file(tmp, name, fmt).write_text(text)
        manifest = {
            "forge_version": forge.__version__,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **info,
            "runtime_transformers": compat.rules()["runtime_transformers"],
            "names": _names(planned),
            "source": {"spec": src.spec, "folder": str(src.folder) if Path(src.spec).is_dir() else None,
                       "lora_base": str(src.base) if src.base else None,
                       "run_id": src.run_id, "tracking_uri": redact_uri(src.tracking_uri), "versions": src.versions},
            "config_changes": planned.config_changes, "tokenizer_changes": planned.tokenizer_changes,
            "files": {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())},
            "lineage": src.lineage.to_dict() if src.lineage else None,
        }
        if opts.verify:
            from forge.export.verify import verify

            with phase("export: verifying (reloading the export, comparing logits, generating)"):
                manifest["verification"] = verify(src, tmp, opts.dtype, log=log)
        (tmp / MANIFEST).write_text(json.dumps(scrub_dict(manifest), indent=2) + "\n")  # paths, lineage: scrubbed
        request = None
        if opts.role_arn and opts.s3_uri:
            request = write_job_request(tmp, fmt, opts.role_arn, opts.s3_uri, planned.job)
        write_marker(tmp)
    return manifest, request


def _own_file(folder: Path, name: str, fmt: Format) -> Path:
    """Where a format's own file goes: a plain name beside the layout's files, never one of them."""
    taken = {p.name for p in folder.iterdir()} | {MANIFEST, MARKER, JOB_REQUEST}
    if "/" in name or "\\" in name or name in (".", "..") or name in taken:
        raise ForgeError(f"--format {fmt.name}: its file {name!r} is not a new plain file name in the export "
                         f"(the layout writes {', '.join(sorted(taken))})")
    return folder / name


def write_job_request(folder: Path, fmt: Format, role_arn: str, s3_uri: str, job: str | None = None) -> dict:
    """The import-job request for an export folder (JOB_REQUEST), its tags carrying the lineage and
    manifest hash."""
    manifest = json.loads((folder / MANIFEST).read_text())
    lineage = Lineage.model_validate(manifest["lineage"]) if manifest.get("lineage") else None
    names = {**manifest["names"], **({"jobName": job} if job else {})}
    request = fmt.job_request(names, role_arn, s3_uri, lineage, {"forge:manifest_sha256": sha256(folder / MANIFEST)})
    (folder / JOB_REQUEST).write_text(json.dumps(request, indent=2) + "\n")
    return request


def _track(src: Source, out: Path, manifest: dict, request: dict | None, log) -> None:
    """Log the manifest (and job request) on the Novella's MLflow run; tag its registry versions."""
    if not (src.run_id and src.tracking_uri):
        log("tracking: source has no MLflow run (give --tracking-uri to find it): export not logged")
        return
    from forge import track

    files = {MANIFEST: manifest, **({JOB_REQUEST: request} if request else {})}
    try:
        tagged = track.log_export(src.tracking_uri, src.run_id, files, out.resolve().as_uri())
    except Exception as e:  # the export is written and complete; only its record failed
        log(f"tracking: warning: could not log the export on run {src.run_id}: {type(e).__name__}: {e}")
        return
    log(f"tracking: logged on run {src.run_id}; exported_uri tagged on {', '.join(tagged) or 'no registry version'}")


def _write_weights(src: Source, tmp: Path, opts: ExportOptions, sizes: dict[str, int]) -> int:
    """Shards of at most `max_shard_bytes` (a bigger tensor gets its own), named and indexed as
    transformers writes them; floating tensors cast to the export dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > opts.max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    shard_of = {n: i for i, names in enumerate(shards) for n in names}
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    pending: dict[int, dict[str, torch.Tensor]] = {}
    n_params = 0
    weights = f"export: weights ({sum(sizes.values()) / 1e6:,.0f} MB)"
    for name, tensor in counted(source_tensors(src), len(sizes), weights, "tensor"):
        if name not in shard_of:
            raise ForgeError(f"{src.folder}: weight {name} appeared that the headers did not list")
        t = tensor.to(TORCH[opts.dtype]) if tensor.is_floating_point() else tensor
        n_params += t.numel()
        i = shard_of[name]
        pending.setdefault(i, {})[name] = t.contiguous()
        if len(pending[i]) == len(shards[i]):  # a shard is written as soon as it is complete
            try:
                save_file(pending.pop(i), str(tmp / files[i]), metadata={"format": "pt"})
            except SafetensorError as e:  # safetensors reports a failed write (ENOSPC, EIO) as its own error
                code, text = re.search(r"code: (\d+)", str(e)), re.search(r'message: "([^"]+)"', str(e))
                raise OSError(int(code.group(1)) if code else errno.EIO, text.group(1) if text else str(e).splitlines()[0],
                              str(tmp / files[i])) from None
            os.chmod(tmp / files[i], 0o644)  # safetensors writes owner-only; an export is for sharing
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": {n: files[shard_of[n]] for n in sizes}}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return n_params


def _chat_template(folder: Path, tok_config: dict | None, opts: ExportOptions, fmt: Format):
    if opts.chat_template is not None:
        return opts.chat_template, "given"
    own = compat.read_chat_template(folder, tok_config or {})
    if own is not None:
        return own, "model"
    default = fmt.chat_template()
    return (default, "default") if default is not None else (None, "none")


def _generation_config(src: Source, config: dict) -> dict:
    existing = _read_json(src.model_folder / "generation_config.json") or {}
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    gen.update(existing)
    gen["transformers_version"] = compat.rules()["runtime_transformers"]
    return gen


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ForgeError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def redact_uri(uri: str | None) -> str | None:
    """A tracking URI without any user:password (never written to a manifest or logged)."""
    if not uri:
        return uri
    parts = urlsplit(uri)
    if parts.username or parts.password:
        return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
    return uri
