"""`compile: true`: each decoder layer's training forward compiled with torch.compile, as torchtitan
does per block (one small graph that every layer reuses, compiled at the first step). The module
tree and its parameter names stay as they are, so checkpoints, FSDP2 sharding per layer and LoRA
see the same model. Only steps that train are compiled: evaluation, sample generation and reference
log-probs (no gradients, or a KV cache whose state and layer index the compiler would guard on, one
graph each, past its recompile limit) run the same layers eagerly. The loss, the embeddings and the
head run eagerly too."""
from __future__ import annotations

from typing import Callable, ParamSpec, TypeVar

import torch

from forge.train import attention
from forge.train.fsdp import decoder_layers, hf_model

P = ParamSpec("P")
R = TypeVar("R")


def compile_layers(model: torch.nn.Module, where: str) -> int:
    """Compile every decoder layer's training forward (a transformers model, or PEFT around one);
    returns how many. A model without known decoder layers is refused, naming the stage."""
    layers = decoder_layers(hf_model(model), f"{where}: compile: true", "set compile: false")
    if attention.uses_packed_attention(hf_model(model)):  # its per-batch layout would recompile every step
        hf_model(model).set_attn_implementation("sdpa")
    for layer in layers:
        layer.forward = _training_compiled(layer.forward)
    return len(layers)


def _training_compiled(eager: Callable[P, R]) -> Callable[P, R]:
    compiled = torch.compile(eager)

    def forward(*args: P.args, **kwargs: P.kwargs) -> R:
        trains = torch.is_grad_enabled() and kwargs.get("cache") is None and kwargs.get("past_key_values") is None
        return (compiled if trains else eager)(*args, **kwargs)

    forward.compiled = compiled  # type: ignore[attr-defined]
    return forward
