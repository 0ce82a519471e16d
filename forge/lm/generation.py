"""Generation: completions of chat prompts (sample tables, the mean-reward evaluation), and the
rollout generators of reinforcement fine-tuning: `group` completions per prompt, as token ids,
from Hugging Face `generate` (the default) or from vLLM's offline `LLM` engine
(`rft.generation: vllm`), whose weights are replaced by the policy's before every rollout.

Both return, per prompt and sample (the samples of one prompt consecutive), the completion's
token ids up to and including the first EOS; `completion_batch` turns them into the padded
tensors the GRPO loss needs.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

import torch

from forge.data.formats import ChatEncoder
from forge.data.packing import pad_token_id
from forge.errors import ForgeError
from forge.recipe.rft_settings import RftStage

# a transformers model (or a PEFT model over one) and its tokenizer: Any to mypy, as the session holds them
Model = Any
Tokenizer = Any
Device = torch.device | str


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cut_at_eos(ids: list[int], eos: int | None) -> list[int]:
    """The tokens up to and including the first EOS (what the model actually generated)."""
    return ids[:ids.index(eos) + 1] if eos is not None and eos in ids else list(ids)


class Generator(Protocol):
    """A rollout generator: `group` completions per prompt, as token ids (see the module doc)."""

    def sync(self, model: Model) -> None: ...
    def generate(self, model: Model, prompts: list[list[int]]) -> list[list[int]]: ...


class HfGenerator:
    """`model.generate` with sampling on the unwrapped policy (left-padded prompts)."""

    def __init__(self, stage: RftStage, tokenizer: Tokenizer, pad_id: int, device: Device):
        self.stage, self.tok, self.pad, self.device = stage, tokenizer, pad_id, device

    def sync(self, model: Model) -> None:
        """Nothing to do: generation runs on the policy itself."""

    @torch.no_grad()
    def generate(self, model: Model, prompts: list[list[int]]) -> list[list[int]]:
        st, width = self.stage, max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(x)) + x for x in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], device=self.device)
        # top_k 0 by default: no cut at generate's default of 50, so completions come from what the loss scores
        seqs = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=st.temperature,
                              top_p=st.top_p, top_k=st.top_k, max_new_tokens=st.max_new_tokens,
                              num_return_sequences=st.group, pad_token_id=self.pad, eos_token_id=self.tok.eos_token_id)
        return [cut_at_eos(row, self.tok.eos_token_id) for row in seqs[:, width:].tolist()]


class VllmGenerator:
    """vLLM's offline engine in this process (one per rank, like TRL's colocate mode), started from
    the stage's input checkpoint; `sync(model)` loads the policy's current weights into it."""

    def __init__(self, stage: RftStage, checkpoint: Path, tokenizer: Tokenizer, seed: int):
        if not vllm_installed():  # the recipe check normally catches this first
            raise ForgeError(f"stage {stage.name}: generation: vllm, but vllm is not installed (pip install vllm)")
        import os

        from vllm import LLM, SamplingParams

        # the engine in this process (not vLLM V1's engine-core subprocess), so its model can take new weights
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.stage, self.tok = stage, tokenizer
        self.llm = LLM(model=str(checkpoint), tokenizer=str(checkpoint), dtype="float32" if stage.precision == "fp32"
                       else "bfloat16", seed=seed, gpu_memory_utilization=stage.vllm_gpu_memory,
                       max_model_len=stage.seq_len, enforce_eager=True)
        self.params = SamplingParams(n=stage.group, temperature=stage.temperature, top_p=stage.top_p,
                                     top_k=stage.top_k or -1,  # vLLM's "no cut" is -1
                                     max_tokens=stage.max_new_tokens)

    def _engine_model(self) -> Any:
        try:  # where TRL's colocate mode finds it (vLLM's in-process executor)
            return self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError as e:
            raise ForgeError(f"stage {self.stage.name}: cannot reach the vLLM engine's model to load the policy's "
                             f"weights ({e}); this vLLM version is not supported, use generation: hf") from None

    @torch.no_grad()
    def sync(self, model: Model) -> None:
        """Replace the engine's weights with the policy's (HF names; vLLM's load_weights maps them)."""
        weights = [(name, p.detach()) for name, p in _plain_named_parameters(model)]
        self._engine_model().load_weights(weights)
        if hasattr(self.llm, "reset_prefix_cache"):  # cached prefixes hold the old weights' keys/values
            self.llm.reset_prefix_cache()

    def generate(self, model: Model, prompts: list[list[int]]) -> list[list[int]]:
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], self.params, use_tqdm=False)
        if len(outs) != len(prompts) or any(len(o.outputs) != self.stage.group for o in outs):
            raise ForgeError(f"stage {self.stage.name}: vLLM returned {len(outs)} results for {len(prompts)} prompts "
                             f"(expected {self.stage.group} completions each)")
        return [cut_at_eos(list(c.token_ids), self.tok.eos_token_id) for o in outs for c in o.outputs]


def _plain_named_parameters(model: Model) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's parameters under plain Hugging Face names; a PEFT model's LoRA deltas are merged
    into each base weight (W + scale * B @ A), so the engine samples from the policy being trained."""
    if not hasattr(model, "peft_config"):
        yield from model.named_parameters()
        return
    from peft.tuners.lora import LoraLayer

    inner = model.base_model.model
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer):
            layer: Any = module  # the concrete LoRA layers (Linear, Embedding, ...) define get_delta_weight
            base = layer.get_base_layer()
            yield f"{name}.weight", base.weight + layer.get_delta_weight("default")
            if base.bias is not None:
                yield f"{name}.bias", base.bias
    for name, p in inner.named_parameters():
        if "lora_" not in name and ".base_layer." not in name:
            yield name, p


def make_generator(stage: RftStage, checkpoint: Path, tokenizer: Tokenizer, pad_id: int, device: Device,
                   seed: int) -> Generator:
    if stage.generation == "vllm":
        return VllmGenerator(stage, checkpoint, tokenizer, seed)
    return HfGenerator(stage, tokenizer, pad_id, device)


def completion_batch(prompts: list[list[int]], completions: list[list[int]], group: int, pad_id: int, device: Device
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(sequences, attention mask, completion mask, prompt width): prompts left-padded to one width,
    each repeated `group` times, followed by its completions right-padded."""
    width = max(map(len, prompts))
    span = max(1, max(map(len, completions)))
    rows: list[list[int]] = []
    masks: list[list[int]] = []
    cmasks: list[list[int]] = []
    for i, comp in enumerate(completions):
        p = prompts[i // group]
        rows.append([pad_id] * (width - len(p)) + p + comp + [pad_id] * (span - len(comp)))
        masks.append([0] * (width - len(p)) + [1] * len(p) + [1] * len(comp) + [0] * (span - len(comp)))
        cmasks.append([1] * len(comp) + [0] * (span - len(comp)))
    def t(x: list[list[int]]) -> torch.Tensor:
        return torch.tensor(x, device=device)

    return t(rows), t(masks), t(cmasks), width


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn: greedy when `temperature` is None, else sampled at it; `n` per prompt."""

    max_new_tokens: int
    temperature: float | None = None
    n: int = 1


@torch.no_grad()
def generate(model: Model, tokenizer: Tokenizer, encoder: ChatEncoder, prompts: list[list[dict[str, Any]]],
             sampling: Sampling, device: Device) -> list[str]:
    """Completions of chat prompts, decoded without special tokens; the `sampling.n` completions of
    one prompt are consecutive."""
    texts = [encoder.render(p, add_generation_prompt=True) for p in prompts]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return generate_ids(model, tokenizer, ids, sampling, device)


@torch.no_grad()
def generate_ids(model: Model, tokenizer: Tokenizer, ids: list[list[int]], sampling: Sampling,
                 device: Device) -> list[str]:
    """Completions of already tokenized prompts (see generate)."""
    was_training = model.training
    model.eval()
    width = max(len(x) for x in ids)
    pad = pad_token_id(tokenizer)
    batch = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)  # left padding
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    sample = sampling.temperature is not None
    out = model.generate(input_ids=batch, attention_mask=mask, max_new_tokens=sampling.max_new_tokens, do_sample=sample,
                         **({"temperature": sampling.temperature} if sample else {}),
                         num_return_sequences=sampling.n, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    texts: list[str] = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts
