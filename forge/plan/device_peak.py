"""Which catalog chip a training process runs on, found by its device's name, and that chip's peak
FLOP/s at a precision: the denominator of the MFU the training loop logs per window.

A device is matched by the chip's catalog key as a whole word of the name the runtime reports
("NVIDIA H100 80GB HBM3" is `h100`, "NVIDIA H200" is `h200`); a CPU, or a device the catalog does
not hold, has no published peak, so no MFU is claimed for it (the achieved FLOP/s still is).
"""
from __future__ import annotations

import re

from forge.errors import ForgeError
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import load_catalog
from forge.plan.model import spec_from_config


def chip_key_for_device(device_name: str, catalog: dict | None = None) -> str | None:
    """The catalog chip whose key names this device, or None (a CPU, an unknown accelerator)."""
    chips = (catalog if catalog is not None else load_catalog()).get("chips", {})
    for key, raw in chips.items():
        if raw.get("status") == "local":
            continue
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, re.IGNORECASE):
            return str(key)
    return None


def peak_flops_for_device(device_name: str, precision: str, catalog: dict | None = None) -> float | None:
    """Peak FLOP/s of one such chip at `precision` (dense), or None when the catalog has no figure."""
    catalog = catalog if catalog is not None else load_catalog()
    key = chip_key_for_device(device_name, catalog)
    if key is None:
        return None
    peak = (catalog["chips"][key].get("peak_tflops") or {}).get(precision)
    return float(peak) * 1e12 if peak else None


def flops_per_token(model_config: dict, seq_len: int) -> float | None:
    """Model FLOPs per trained token (forward and backward, attention included: the planner's
    count, PaLM's MFU convention), or None for a model the planner does not know."""
    try:
        return training_flops_per_token(spec_from_config(model_config), seq_len)
    except (ForgeError, KeyError, TypeError, ValueError):
        return None
