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
        src.base = _adapter_base(src.folder)
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
def _adapter_base(adapter: Path) -> Path:
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
    lora_alpha / r, or / sqrt(r) with use_rslora). Whole modules the adapter saved replace the base's."""
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    for key in ("use_dora", "alpha_pattern"):
        if cfg.get(key):
            raise ForgeError(f"{adapter}/adapter_config.json: {key} is not supported by forge's merge")
    lora: dict[str, dict[str, torch.Tensor]] = {}
    replaced: dict[str, torch.Tensor] = {}
    for name, tensor in iter_tensors(adapter):
        key = name.removeprefix("base_model.model.")
        m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if m:
            lora.setdefault(m.group(1) + ".weight", {})[m.group(2)] = tensor
        else:
            replaced[re.sub(r"\.modules_to_save(\.[^.]+)?", "", key)] = tensor
    seen = set()
    for name, weight in iter_tensors(base):
        if name in replaced:
            weight = replaced[name]
        elif name in lora:
            a, b = lora[name]["A"].float(), lora[name]["B"].float()
            r = a.shape[0]
            scale = cfg.get("lora_alpha", r) / (r ** 0.5 if cfg.get("use_rslora") else r)
            delta = (b @ a) * scale
            weight = (weight.float() + (delta.T if cfg.get("fan_in_fan_out") else delta)).to(weight.dtype)
        seen.add(name)
        yield name, weight
    missing = sorted((set(lora) | set(replaced)) - seen)
    if missing:
        raise ForgeError(f"{adapter}: adapter weights for modules the base does not have: {', '.join(missing[:5])}")
