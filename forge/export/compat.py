"""Make a checkpoint's config.json and tokenizer_config.json load under transformers 4.51.3.

forge trains with transformers 5, whose files use newer keys (`rope_parameters`, `dtype`, the
`TokenizersBackend` class, chat templates in a separate file); Bedrock's runtime is 4.51.3. Each
function returns the translated dict and a record of what changed, which goes into the manifest.
"""
from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml

from forge.errors import ForgeError

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
# rope types 4.51.3 implements (modeling_rope_utils.ROPE_INIT_FUNCTIONS)
ROPE_TYPES_4513 = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"}
# tokenizer_config.json keys transformers 5 writes that 4.51.3 misreads or passes on to __init__
TOKENIZER_V5_ONLY = {"backend", "is_local", "local_files_only"}


@functools.cache
def rules() -> dict:
    """Bedrock's supported architectures, tokenizer classes and limits (forge/export/bedrock.yaml)."""
    return yaml.safe_load(resources.files("forge.export").joinpath("bedrock.yaml").read_text())


@functools.cache
def known_keys() -> dict:
    """Config keys 4.51.3 knows: {'common': [...], 'models': {model_type: [...]}}."""
    return yaml.safe_load(resources.files("forge.export").joinpath("hf4513_keys.yaml").read_text())


def translate_config(config: dict, dtype: str, drop_unknown: bool = True) -> tuple[dict, dict]:
    """config.json for transformers 4.51.3: `rope_parameters` -> `rope_theta`/`rope_scaling`,
    `dtype` -> `torch_dtype` (set to the exported `dtype`), keys 4.51.3 does not know dropped
    (when `drop_unknown`). Returns (config, {'renamed': {...}, 'dropped': [...]})."""
    out = dict(config)
    changes: dict = {"renamed": {}, "dropped": []}
    model_type = out.get("model_type")
    if "rope_parameters" in out:
        rope = out.pop("rope_parameters")
        if rope is not None:
            _rope_to_v4(rope, out, model_type)
        changes["renamed"]["rope_parameters"] = "rope_theta, rope_scaling"
    if "dtype" in out:
        out.pop("dtype")
        changes["renamed"]["dtype"] = "torch_dtype"
    out["torch_dtype"] = TORCH_DTYPES[dtype]
    out["transformers_version"] = rules()["runtime_transformers"]
    models = known_keys()["models"]
    if drop_unknown and model_type in models:
        known = set(known_keys()["common"]) | set(models[model_type])
        changes["dropped"] = sorted(k for k in out if k not in known)
        for k in changes["dropped"]:
            del out[k]
    return out, changes


def _rope_to_v4(rope: dict, out: dict, model_type: str | None) -> None:
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        raise ForgeError(f"config.json: rope_parameters: per-layer-type RoPE settings cannot be expressed "
                         f"for transformers {rules()['runtime_transformers']}")
    rope = dict(rope)
    if "rope_theta" in rope:
        out["rope_theta"] = rope.pop("rope_theta")
    if "partial_rotary_factor" in rope:  # a top-level key in 4.x
        out["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default" and set(rope) <= {"rope_type", "type"}:
        out.setdefault("rope_scaling", None)
        return
    if kind not in ROPE_TYPES_4513:
        raise ForgeError(f"config.json: rope_parameters.rope_type {kind!r} is not implemented by transformers "
                         f"{rules()['runtime_transformers']} (it has: {', '.join(sorted(ROPE_TYPES_4513))})")
    if model_type in known_keys()["models"] and "rope_scaling" not in known_keys()["models"][model_type]:
        raise ForgeError(f"config.json: rope_parameters: {model_type} in transformers "
                         f"{rules()['runtime_transformers']} has no RoPE scaling, but this model uses {kind!r}")
    out["rope_scaling"] = rope


def translate_tokenizer_config(tok_config: dict, chat_template: str | None) -> tuple[dict, dict]:
    """tokenizer_config.json for 4.51.3, with `chat_template` inline (Bedrock's Converse API reads
    it there). Returns (config, {'renamed': {...}, 'dropped': [...]})."""
    out = dict(tok_config)
    changes: dict = {"renamed": {}, "dropped": []}
    for key in sorted(TOKENIZER_V5_ONLY & set(out)):
        del out[key]
        changes["dropped"].append(key)
    cls = out.get("tokenizer_class")
    renames = rules()["tokenizer_class_renames"]
    if cls in renames:
        out["tokenizer_class"] = renames[cls]
        changes["renamed"][f"tokenizer_class {cls}"] = renames[cls]
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):  # 5.x: a list of tokens; 4.51.3 expects a {name: token} dict
        del out["extra_special_tokens"]
        named = {out.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                                      "cls_token", "mask_token")}
        additional = [t for t in extra if t not in named and t not in out.get("additional_special_tokens", [])]
        if additional:
            out["additional_special_tokens"] = list(out.get("additional_special_tokens", [])) + additional
        changes["renamed"]["extra_special_tokens (list)"] = "additional_special_tokens"
    if chat_template is not None:
        out["chat_template"] = chat_template
    return out, changes


def read_chat_template(folder: Path, tok_config: dict) -> str | None:
    """The chat template a checkpoint carries: tokenizer_config.json's, or chat_template.jinja (5.x)."""
    if isinstance(tok_config.get("chat_template"), str):
        return tok_config["chat_template"]
    jinja = Path(folder) / "chat_template.jinja"
    return jinja.read_text() if jinja.is_file() else None
