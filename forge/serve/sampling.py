"""Sampling for the SDK's SamplingClient: a sampler is a snapshot of a model's adapters (taken by
save_weights_for_sampler, or read from a saved checkpoint) or a base itself; its samples are drawn
on a sampling copy of the base (a Host), never on a training model, so sampling changes no client's
training state. One host per base and LoRA shape is kept loaded (the last HOSTS used); a sampler's
adapters are copied into it before its call.

Each of `num_samples` sequences continues the prompt token by token (the KV cache of the prompt's
one forward pass shared), drawn at the request's temperature from its top_k / top_p cut (greedy at
temperature 0), until a stop or max_tokens. A sequence ends with the token that completes a stop:
an end-of-sequence token of the base (unless `stop` is []), a stop token id, or the token whose
text completes a stop string. Each token's log-probability is the model's at the request's
temperature (log_softmax(logits / T), before the top_k / top_p cut; at T = 1, the forward pass's
own), which is what the policy losses take as the sampler's `logprobs`.
"""
from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from forge.serve.config import BaseSpec
from forge.serve.trainer import Adapters
from forge.serve.wire import Refused, SamplingParams

HOSTS = 2  # sampling copies kept loaded (each holds a base's weights)


@dataclass
class Sampler:
    id: str
    owner: str                  # the fingerprint of the API key that made it
    session_id: str
    spec: BaseSpec
    base: Path                  # the base's local folder
    adapters: Adapters | None   # the LoRA shape (None: the base alone)
    weights: dict[str, torch.Tensor] | None  # the adapters' tensors under PEFT's saved names, on the CPU
    model_path: str | None = None  # the checkpoint it was read from


@dataclass(frozen=True)
class Drawn:
    stopped: bool  # at a stop (else at max_tokens)
    tokens: list[int]
    logprobs: list[float]


class Host:
    """A base (with LoRA layers of one shape) loaded for sampling, on the accelerator if there is one."""

    def __init__(self, base: Path, adapters: Adapters | None, precision: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from forge.train.lora import wrap_lora

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.bf16 = precision == "bf16" and self.device.type == "cuda"
        model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, use_safetensors=True)
        if adapters is not None:
            model = wrap_lora(model, adapters, f"sampling {base}")
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(base)
        config = self.model.config
        context = getattr(config, "max_position_embeddings", None)
        self.vocab, self.context = int(config.vocab_size), int(context) if context is not None else None
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos = eos if eos is not None else config.eos_token_id
        self.eos = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.loaded: dict[str, torch.Tensor] | None = None  # the adapters in the model (held: never another's id)

    def use(self, sampler: Sampler) -> None:
        if sampler.weights is None or self.loaded is sampler.weights:
            return
        from peft import set_peft_model_state_dict

        with torch.no_grad():
            set_peft_model_state_dict(self.model, sampler.weights)
        self.loaded = sampler.weights


class Hosts:
    def __init__(self, precision: str, keep: int = HOSTS):
        self.precision, self.keep = precision, keep
        self._hosts: OrderedDict[tuple[str, Adapters | None], Host] = OrderedDict()

    def get(self, sampler: Sampler) -> Host:
        key = (str(sampler.base), sampler.adapters)
        host = self._hosts.pop(key, None) or Host(sampler.base, sampler.adapters, self.precision)
        self._hosts[key] = host  # the most recently used last
        while len(self._hosts) > self.keep:
            self._hosts.popitem(last=False)
        return host

    def clear(self) -> None:
        self._hosts.clear()


def prompt_tokens(chunks: list[Any], host: Host) -> list[int]:
    tokens: list[int] = []
    for j, chunk in enumerate(chunks):
        if chunk.type != "encoded_text":
            raise Refused(f"prompt.chunks[{j}]: {chunk.type} chunks are unsupported; send encoded text")
        tokens += chunk.tokens
    if not tokens:
        raise Refused("prompt: no tokens")
    if min(tokens) < 0 or max(tokens) >= host.vocab:
        raise Refused(f"prompt: token ids must be in [0, {host.vocab}); got {min(tokens)}..{max(tokens)}")
    return tokens


def budget(params: SamplingParams, prompt: int, host: Host) -> int:
    """max_tokens, checked against the context (None: what the context leaves)."""
    if params.max_tokens is None:
        if host.context is None:
            raise Refused("sampling_params.max_tokens: required (the base's context is not known)")
        if host.context <= prompt:
            raise Refused(f"prompt: {prompt} tokens leave no room in the base's context of {host.context}")
        return host.context - prompt
    if host.context is not None and prompt + params.max_tokens > host.context:
        raise Refused(f"sampling_params.max_tokens: the prompt's {prompt} tokens + max_tokens {params.max_tokens} "
                      f"exceed the base's context of {host.context}")
    return params.max_tokens


def stops(stop: str | list[str] | list[int] | None, host: Host) -> tuple[frozenset[int], tuple[str, ...]]:
    """(stop token ids, stop strings): None stops at the base's end-of-sequence tokens, [] nowhere;
    given strings or ids stop there as well as at end-of-sequence."""
    if stop is None:
        return host.eos, ()
    if isinstance(stop, str):
        return host.eos, (stop,)
    if not stop:
        return frozenset(), ()
    if all(isinstance(s, int) for s in stop):
        return host.eos | {int(s) for s in stop}, ()
    if any(not s for s in stop):
        raise Refused("sampling_params.stop: a stop string must not be empty")
    return host.eos, tuple(str(s) for s in stop)


def _cut(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits outside the top_k and outside the smallest set of probability top_p set to -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        outside = probs.cumsum(-1) - probs > top_p  # the most likely token always stays
        ordered = ordered.masked_fill(outside, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return logits


@torch.no_grad()
def draw(host: Host, prompt: list[int], n: int, params: SamplingParams, want_prompt: bool,
         last_n: int | None) -> tuple[list[Drawn], list[float] | None]:
    """`n` sequences continuing `prompt` (see the module doc), and the prompt's log-probs when
    wanted (NaN at its first token, and before its last `last_n` when given)."""
    limit = budget(params, len(prompt), host)
    stop_ids, stop_texts = stops(params.stop, host)
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    gen = torch.Generator(device=host.device).manual_seed(seed)
    temperature = params.temperature or 1.0  # the log-probs of greedy decoding are the model's own
    with torch.autocast(host.device.type, dtype=torch.bfloat16, enabled=host.bf16):
        out = host.model(input_ids=torch.tensor([prompt], device=host.device), use_cache=True)
        prompt_lp = _prompt_logprobs(out.logits[0].float(), prompt, last_n) if want_prompt else None
        past = out.past_key_values
        past.batch_repeat_interleave(n)
        logits = out.logits[:, -1].float().expand(n, -1)
        rows: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        stopped = [False] * n
        for _ in range(limit):
            logp = F.log_softmax(logits / temperature, dim=-1)
            if params.temperature == 0:
                chosen = logits.argmax(-1)
            else:
                probs = _cut(logits / temperature, params.top_k, params.top_p).softmax(-1)
                chosen = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            picked = logp.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
            for i, (token, lp) in enumerate(zip(chosen.tolist(), picked)):
                if stopped[i]:
                    continue
                rows[i].append(token)
                lps[i].append(lp)
                stopped[i] = token in stop_ids or (bool(stop_texts) and _ends(host, rows[i], stop_texts))
            if all(stopped):
                break
            out = host.model(input_ids=chosen.unsqueeze(1), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1].float()
    return [Drawn(s, r, lp) for s, r, lp in zip(stopped, rows, lps)], prompt_lp


def _ends(host: Host, tokens: list[int], texts: tuple[str, ...]) -> bool:
    text = host.tokenizer.decode(tokens)
    return any(t in text for t in texts)


def _prompt_logprobs(logits: torch.Tensor, prompt: list[int], last_n: int | None) -> list[float]:
    if last_n is not None and not 1 <= last_n <= len(prompt) - 1:
        raise Refused(f"prompt_logprobs_last_n: {last_n} must be in 1..{len(prompt) - 1} (the prompt's length - 1)")
    targets = torch.tensor(prompt[1:], device=logits.device)
    scored = F.log_softmax(logits[:-1], dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
    values = [float("nan"), *scored]
    if last_n is not None:
        values = [float("nan")] * (len(values) - last_n) + values[-last_n:]
    return values
