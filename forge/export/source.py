"""What an export starts from: a Novella folder, a registered model or an MLflow run, resolved to a
local Hugging Face folder, and its weights read tensor by tensor (LoRA adapters merged on the way).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
import yaml

from forge.base_check import outside_shards
from forge.errors import ForgeError, not_safetensors
from forge.lineage import Lineage
from forge.rundir import RunLayout

RUN_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class Source:
    spec: str                        # what the user named
    folder: Path                     # HF checkpoint, or a LoRA adapter whose base is `base`
    lineage: Lineage | None = None
    tracking_uri: str | None = None  # where the Novella's run lives, when known
    run_id: str | None = None
    versions: list[str] = field(default_factory=list)  # registry 'name/version's made from the run
    base: Path | None = None         # LoRA: the base checkpoint the adapter applies to

    @property
    def model_folder(self) -> Path:
        """Where config.json and the tokenizer are (the base's, for an adapter)."""
        return self.base or self.folder


def resolve(spec: str, tracking_uri: str | None, workdir: Path) -> Source:
    """`spec`: a folder, `models:/name@alias` / `models:/name/version`, or a 32-hex MLflow run id.
    Registered models are downloaded under `workdir`."""
    from forge import track

    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if spec.startswith("models:/"):
        uri = _need_uri(spec, tracking_uri)
        got = track.fetch_registered_model(spec, uri, workdir)
        src = Source(spec, got["folder"], tracking_uri=uri, run_id=got["run_id"],
                     versions=[f"{got['name']}/{got['version']}"])
    elif Path(spec).is_dir():
        src = Source(spec, Path(spec).resolve())
        lineage = _read_lineage(src.folder)
        uri = tracking_uri or _recipe_tracking_uri(src.folder)
        if lineage is not None and uri is not None:
            try:
                src.run_id = track.find_novella_run(uri, lineage)
                if src.run_id:
                    src.tracking_uri = uri
                    src.versions = [f"{n}/{v}" for n, v in track.registered_versions_of_run(src.run_id, uri)]
            except Exception:  # an unreachable store: the export goes on, unrecorded (it says so)
                src.run_id = None
    elif RUN_ID.fullmatch(spec):
        uri = _need_uri(spec, tracking_uri)
        versions = track.registered_versions_of_run(spec, uri)
        if not versions:
            raise ForgeError(f"run {spec}: no registered model was made from it; export its novella folder instead")
        name, version = max(versions, key=lambda nv: int(nv[1]))
        got = track.fetch_registered_model(f"models:/{name}/{version}", uri, workdir)
        src = Source(spec, got["folder"], tracking_uri=uri, run_id=spec, versions=[f"{n}/{v}" for n, v in versions])
    else:
        raise ForgeError(f"source {spec!r}: not a folder, a models:/NAME@ALIAS URI or an MLflow run id")
    src.lineage = _read_lineage(src.folder)
    if (src.folder / "adapter_config.json").is_file():
        src.base = adapter_base(src.folder)
    elif not (src.folder / "config.json").is_file():
        raise ForgeError(f"{src.folder}: no config.json (not a Hugging Face checkpoint folder)")
    return src


def _need_uri(spec: str, uri: str | None) -> str:
    if not uri:
        raise ForgeError(f"{spec}: give --tracking-uri (or set MLFLOW_TRACKING_URI) to find it")
    return uri


def _read_lineage(folder: Path) -> Lineage | None:
    path = Path(folder) / "lineage.json"
    return Lineage.read(path) if path.is_file() else None


def _recipe_tracking_uri(novella: Path) -> str | None:
    """A `forge run` output folder holds recipe.resolved.yaml beside novella/: its tracking store."""
    layout = RunLayout(novella.parent)
    resolved = layout.resolved_recipe
    if not resolved.is_file():
        return None
    uri = (yaml.safe_load(resolved.read_text()).get("tracking") or {}).get("uri")
    if uri:
        return uri
    db = layout.mlflow_db  # the recipe default; never create a store that is not there
    return f"sqlite:///{db}" if db.is_file() else None


# ------------------------------------------------------------------------- weights
def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in index order."""
    folder = Path(folder)
    for index in ("model.safetensors.index.json", "adapter_model.safetensors.index.json"):
        if (folder / index).is_file():
            names = list(dict.fromkeys(json.loads((folder / index).read_text())["weight_map"].values()))
            outside = outside_shards(names)
            if outside:
                raise ForgeError(f"{folder / index}: names shard(s) outside the folder: {', '.join(outside)}")
            return _regular([folder / n for n in names])
    files = _regular(sorted(folder.glob("*.safetensors")))
    if not files:
        bins = sorted(p.name for p in folder.glob("*.bin"))
        hint = f" (found {', '.join(bins)}: re-save it with safe_serialization=True)" if bins else ""
        raise ForgeError(f"{folder}: no *.safetensors weights{hint}")
    return files


def _regular(paths: list[Path]) -> list[Path]:
    """The paths, each a regular file: safetensors would wait forever on a FIFO named like a shard."""
    for path in paths:
        if path.exists() and not path.is_file():
            raise ForgeError(f"{path}: not a regular file; weights are read only from regular files")
    return paths


def tensor_specs(folder: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """name -> (dtype, shape) from the safetensors headers, without reading the tensors."""
    from safetensors import SafetensorError, safe_open

    specs = {}
    for path in weight_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    specs[name] = (_DTYPES[sl.get_dtype()], tuple(sl.get_shape()))
        except SafetensorError as e:
            raise not_safetensors(path, e) from None
    return specs


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def iter_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for path in weight_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except SafetensorError as e:
            raise not_safetensors(path, e) from None


def source_tensors(src: Source) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights to export: the checkpoint's, or the base's with the LoRA adapter merged in."""
    if src.base is None:
        yield from iter_tensors(src.folder)
    else:
        yield from merge_lora(src.folder, src.base)


# --------------------------------------------------------------------------- LoRA
def adapter_base(adapter: Path) -> Path:
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ForgeError(f"{adapter}/adapter_config.json: peft_type {cfg['peft_type']!r}: only LoRA adapters are merged")
    base = cfg.get("base_model_name_or_path")
    path = (adapter / base).resolve() if base else None
    if path is None or not (path / "config.json").is_file():
        raise ForgeError(f"{adapter}/adapter_config.json: base_model_name_or_path {base!r} is not a local "
                         "checkpoint folder (absolute, or relative to the adapter)")
    return path


def merge_lora(adapter: Path, base: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Base weights with W += scale * B @ A for each adapted module (PEFT's layout and scaling:
    lora_alpha / r, or / sqrt(r) with use_rslora). Whole modules the adapter saved replace the base's.
    A head the base ties to its embedding comes last, untied (untied_head)."""
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    for key in ("use_dora", "alpha_pattern"):
        if cfg.get(key):
            raise ForgeError(f"{adapter}/adapter_config.json: {key} is not supported by forge's merge")
    lora: dict[str, dict[str, torch.Tensor]] = {}
    replaced: dict[str, torch.Tensor] = {}
    for name, tensor in iter_tensors(adapter):
        target, factor = _adapted(name)
        if factor:
            lora.setdefault(target, {})[factor] = tensor
        else:
            replaced[target] = tensor

    def merged(name: str, weight: torch.Tensor) -> torch.Tensor:
        weight = replaced.get(name, weight)
        if name in lora:
            a, b = lora[name]["A"].float(), lora[name]["B"].float()
            r = a.shape[0]
            scale = cfg.get("lora_alpha", r) / (r ** 0.5 if cfg.get("use_rslora") else r)
            delta = (b @ a) * scale
            weight = (weight.float() + (delta.T if cfg.get("fan_in_fan_out") else delta)).to(weight.dtype)
        return weight

    embedding = _tied_embedding(adapter, base)
    seen, head_from = set(), None
    for name, weight in iter_tensors(base):
        seen.add(name)
        if embedding and name == HEAD:
            continue  # a tied base computes its logits with the embedding, whatever head it stores
        if name == embedding:
            head_from = weight
        yield name, merged(name, weight)
    if head_from is not None:
        seen.add(HEAD)
        yield HEAD, merged(HEAD, head_from)
    missing = sorted((set(lora) | set(replaced)) - seen)
    if missing:
        raise ForgeError(f"{adapter}: adapter weights for modules the base does not have: {', '.join(missing[:5])}")


def _adapted(name: str) -> tuple[str, str | None]:
    """An adapter tensor's name -> (the base weight it applies to, "A" / "B" for a LoRA factor or
    None for a whole weight: a modules_to_save copy, or the base layer PEFT saves beside a LoRA on
    an embedding or head, which the LoRA's delta then applies to)."""
    key = name.removeprefix("base_model.model.")
    m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
    if m:
        return m.group(1) + ".weight", m.group(2)
    return re.sub(r"\.modules_to_save(\.[^.]+)?|\.base_layer", "", key), None


# --------------------------------------------------------------------- tied heads
HEAD = "lm_head.weight"  # the output projection (a Tinker LoRA's train_unembed adapts it)


def untied_head(src: Source) -> str | None:
    """The base tensor the exported lm_head.weight starts from when the export unties the head from
    the input embedding, else None. A base whose config ties them computes its logits with the
    embedding matrix; an adapter that adapts or replaces lm_head gives the head weights of its own,
    so the export stores lm_head.weight (the embedding plus the adapter's delta, or its replacement)
    beside the embedding, which stays as the base has it, and its config says they are not tied."""
    return _tied_embedding(src.folder, src.base) if src.base is not None else None


def _tied_embedding(adapter: Path, base: Path) -> str | None:
    if HEAD not in {_adapted(n)[0] for n in tensor_specs(adapter)}:
        return None
    config = json.loads((base / "config.json").read_text())
    names = tensor_specs(base)
    tied = config.get("tie_word_embeddings", HEAD not in names) if isinstance(config, dict) else False
    if not tied:  # (with no key: a head the files lack can only be the embedding)
        return None
    said = f"{adapter}: adapts {HEAD}, which {base / 'config.json'} ties to the input embeddings"
    if config.get("is_encoder_decoder"):  # T5 scales the decoder's output only when its head is tied
        raise ForgeError(f"{said}; forge unties a head only in decoder-only models, where that leaves the "
                         "logits as the adapter trained them")
    arch = (config.get("architectures") or [None])[0]
    embedding = _tied_name(arch)
    if embedding is None:
        raise ForgeError(f"{said}; untying it needs the embedding's name, which transformers gives for the "
                         f"architecture: expected architectures[0] to be a transformers model class, got {arch!r}")
    if embedding not in names:
        raise ForgeError(f"{said}; expected its embedding {embedding} in {base}'s safetensors, which lack it")
    return embedding


def _tied_name(arch: object) -> str | None:
    """The input embedding an architecture ties its head to (transformers' own map), if it is known."""
    import transformers

    try:
        cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    except Exception:  # transformers imports a model's module on demand: a missing extra fails there
        cls = None
    tied = getattr(cls, "_tied_weights_keys", None)
    return tied.get(HEAD) if isinstance(tied, dict) else None
