"""The check of a chat model's address, shared by judges (forge.recipe.judge) and model-written
augmentation (forge.recipe.data's `augment.rewrite.model`): a local Hugging Face folder,
`catalog://FAMILY@PHASE`, an OpenAI-compatible `http(s)://` endpoint or `bedrock:MODEL_ID`."""
from __future__ import annotations

from pathlib import Path


def check_address(address: str, what: str = "judge") -> str:
    """`address` if it names a chat model forge can reach, else a ValueError saying what is expected."""
    a = address.strip()
    if a.startswith(("http://", "https://")) or (a.startswith("bedrock:") and len(a) > len("bedrock:")):
        return a
    if a.startswith("catalog://"):
        from forge.catalog import resolve
        from forge.errors import ForgeError

        try:
            resolve(a)  # an unknown family or phase is refused with the list of what exists
        except ForgeError as e:
            raise ValueError(f"{what} {a!r}: {e}") from None
        return a
    if not (Path(a) / "config.json").is_file():
        raise ValueError(f"{what} {a!r}: expected a Hugging Face model folder (with config.json), catalog://FAMILY@PHASE, "
                         "an OpenAI-compatible http(s):// endpoint or bedrock:MODEL_ID")
    return a
