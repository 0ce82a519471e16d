"""LoRA adapters (PEFT): wrapping a model so only the recipe's adapters train. How they are
saved (merged into the base, or as an adapter beside it) is the checkpointer's `save_final`."""
from __future__ import annotations

import torch

from forge.train.settings import LoraSettings


def wrap_lora(model: torch.nn.Module, lora: LoraSettings, where: str) -> torch.nn.Module:
    """The model as a PeftModel with the `lora:` block's adapters on its target modules."""
    from peft import LoraConfig, get_peft_model

    from forge.errors import ForgeError

    have = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(lora.target_modules) - have)
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ForgeError(f"{where}: lora.target_modules {missing} are not modules of "
                         f"{type(model).__name__}; its linear layers: {linear}")
    # lora_alpha: peft annotates an int but scales by alpha / r in floats; the recipe takes 16.0 or 8.5
    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,  # type: ignore[arg-type]
                     target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)
