"""The generator of model-written augmentation (forge.data.rewrite asks it): any chat model forge
can call, through the judges' callers (forge.lm.judges): a local Hugging Face folder or catalog
phase generating here (greedy, in its chat template), an OpenAI-compatible endpoint (temperature 0,
no redirects, its key read from the environment and never recorded) or Bedrock InvokeModel.

`identity` names the generator for the cache key and the lineage without loading it: the address
(a local checkpoint's with the sha256 of its files), the served model; never a credential."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from forge.data.formats import ChatEncoder, FormatSpec
from forge.errors import ForgeError
from forge.lm.generation import Sampling, generate_ids
from forge.lm.judges import LocalJudge, Reach, local_or_remote
from forge.recipe.data import Rewrite
from forge.recipe.judge import JudgeOptions
from forge.rundir import base_fingerprint
from forge.scrub import first_line, scrub

BATCH = 8  # prompts per generate call on a local model (fixed: batches decide the padding, so the output)


def _local_folder(address: str) -> Path | None:
    """The folder of a local or catalog generator (None for an endpoint or Bedrock)."""
    if address.startswith(("http://", "https://", "bedrock:")):
        return None
    if address.startswith("catalog://"):
        from forge.catalog import checkpoint

        return checkpoint(address)
    return Path(address)


def identity(settings: Rewrite, where: str) -> str:
    """The generator's name in the cache key and the lineage: `local:ADDRESS:sha256`,
    `openai:URL:MODEL` or `bedrock:MODEL_ID` (an endpoint's URL scrubbed of credentials)."""
    address = settings.model
    try:
        folder = _local_folder(address)
    except ForgeError as e:
        raise ForgeError(f"{where}: {first_line(e)}") from None
    if folder is not None:
        if not (folder / "config.json").is_file():
            raise ForgeError(f"{where}: {address!r} is not a Hugging Face model folder (no config.json)")
        return f"local:{address}:{base_fingerprint(folder)[:16]}"
    if address.startswith("bedrock:"):
        return address
    return f"openai:{scrub(address)}:{settings.served_model or 'first-listed'}"


class LocalWriter:
    """A causal LM in this process answering prompts greedily in its chat template (forge's default
    template when the tokenizer has none); a prompt longer than the context keeps its last tokens."""

    def __init__(self, folder: Path, max_new_tokens: int, where: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            self.tok: Any = AutoTokenizer.from_pretrained(folder)
            model: Any = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
        except (OSError, ValueError) as e:
            raise ForgeError(f"{where}: {folder} cannot be loaded as a chat model: {first_line(e)}") from None
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model: Any = model.to(self.device).eval()
        self.encoder = ChatEncoder(self.tok, FormatSpec("prompt_completion"))
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 4096)
        self.new = min(max_new_tokens, max(1, context // 2))
        self.room = context - self.new

    def __call__(self, prompts: list[str]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(prompts), BATCH):
            ids = []
            for p in prompts[i:i + BATCH]:
                text = self.encoder.render([{"role": "user", "content": p}], add_generation_prompt=True)
                ids.append(self.tok(text, add_special_tokens=False)["input_ids"][-self.room:])
            out += generate_ids(self.model, self.tok, ids, Sampling(self.new), self.device)
        return out


def open_writer(settings: Rewrite, where: str, reach: Reach | None = None) -> Callable[[list[str]], list[str]]:
    """A function from prompts to the generator's answers; every failure to reach or load it, and
    every failed call, is a ForgeError naming `where` (the recipe field)."""
    folder = _local_folder(settings.model)
    if folder is not None:
        return LocalWriter(folder, settings.max_new_tokens, where)
    options = JudgeOptions.model_validate({"model": settings.served_model, "api_key_env": settings.api_key_env,
                                           "max_tokens": settings.max_new_tokens, "cache": False})
    reach = reach or Reach(timeout_s=settings.timeout_s, region=settings.region)
    try:
        backend = local_or_remote(settings.model, options, reach)
    except ForgeError as e:
        raise ForgeError(f"{where}: {first_line(e)}") from None
    if isinstance(backend, LocalJudge):  # a folder was handled above
        raise AssertionError(settings.model)

    def ask(prompts: list[str]) -> list[str]:
        out = []
        for p in prompts:
            try:
                out.append(backend.ask(p))
            except ForgeError as e:
                raise ForgeError(f"{where}: the generator failed: {first_line(e)}") from None
        return out

    return ask
