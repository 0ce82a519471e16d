"""`compile: true`: torch.compile each decoder layer in place, as torchtitan does (one small graph
that every layer reuses, compiled at the first step; the module tree and its parameter names stay
as they are, so checkpoints, FSDP2 sharding per layer and LoRA see the same model). The loss, the
embeddings and the head run eagerly."""
from __future__ import annotations

import torch

from forge.train.fsdp import decoder_layers, hf_model


def compile_layers(model: torch.nn.Module, where: str) -> int:
    """Compile every decoder layer of `model` (a transformers model, or PEFT around one); returns
    how many. A model without known decoder layers is refused, naming the stage."""
    layers = decoder_layers(hf_model(model), f"{where}: compile: true", "set compile: false")
    for layer in layers:
        layer.compile()
    return len(layers)
