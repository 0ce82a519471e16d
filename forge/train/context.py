"""Context extension: a model config with a longer context and rescaled RoPE, in the form the
installed transformers reads (`rope_parameters` in 5.x), so the written config.json loads with
plain `AutoModelForCausalLM`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from forge.errors import ForgeError
from forge.train.settings import ContextSettings

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def extend_context(config: PretrainedConfig, context: ContextSettings, max_position: int,
                   where: str) -> PretrainedConfig:
    """Set `config` (a transformers PretrainedConfig) to `max_position` tokens with the recipe's
    rope_theta / rope_scaling; returns it. Rotary tables are rebuilt from it when the model loads."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    old = getattr(config, "max_position_embeddings", None)
    params = dict(getattr(config, "rope_parameters", None) or {})
    if context.rope_theta is not None:
        params["rope_theta"] = float(context.rope_theta)
    if context.rope_scaling is not None:
        scaling = context.rope_scaling.model_dump()
        kind = scaling.pop("type")
        if kind not in ROPE_INIT_FUNCTIONS:
            raise ForgeError(f"{where}: context.rope_scaling.type {kind!r} is not supported by the installed "
                             f"transformers; it supports {sorted(ROPE_INIT_FUNCTIONS)}")
        params.update(scaling, rope_type=kind)
        if kind in ("yarn", "llama3", "longrope") and old:
            params.setdefault("original_max_position_embeddings", old)
    params.setdefault("rope_type", "default")
    config.rope_parameters = params
    config.max_position_embeddings = max_position
    try:
        if hasattr(config, "validate_rope"):
            config.validate_rope()
    except (ValueError, KeyError, TypeError) as e:
        raise ForgeError(f"{where}: context: transformers rejects this RoPE setting: {e}") from None
    return config
