"""Sampling routes: create_sampling_session (a sampler of saved weights or of a base), asample
(its samples, a protobuf SampleResponse), samplers/{id} (what the SDK asks of a sampler it did not
make itself). The samples themselves: forge.serve.sampling."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from forge import catalog
from forge.serve import checkpoints as ckpt, proto, wire
from forge.serve.sampling import Sampler, draw, prompt_tokens
from forge.serve.served import Served, owner
from forge.serve.trainer import Adapters, targets
from forge.serve.worker import Reply


def routes(app: FastAPI, served: Served) -> None:
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(body: wire.CreateSamplingSession, request: Request) -> dict[str, Any]:
        who = owner(request)
        served.registry.session(body.session_id, who)  # an ended or unknown session: refused before any read
        made = await asyncio.to_thread(_sampler_of, served, body, who)  # reads the adapter's file
        sampler = served.registry.add_sampler(body.session_id, body.sampling_session_seq_id, made, who)
        return {"type": "create_sampling_session", "sampling_session_id": sampler.id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request) -> dict[str, Any]:
        sampler = served.registry.sampler(sampler_id, owner(request))
        return {"sampler_id": sampler.id, "base_model": sampler.spec.name, "model_path": sampler.model_path}

    @app.post("/api/v1/asample")
    async def asample(body: wire.Sample, request: Request) -> dict[str, Any]:
        if body.sampling_session_id is None:
            raise wire.Refused("asample: sampling_session_id is required (a SamplingClient sends it); sampling by "
                               "base_model or model_path alone is unsupported")
        sampler = served.registry.sampler(body.sampling_session_id, owner(request))
        _served_options(body)
        n, params, want, last_n = body.num_samples, body.sampling_params, bool(body.prompt_logprobs), \
            body.prompt_logprobs_last_n
        if last_n is not None and not want:
            raise wire.Refused("prompt_logprobs_last_n: needs prompt_logprobs")

        def call() -> Reply:
            host = served.hosts.get(sampler)
            host.use(sampler)
            drawn, prompt_lp = draw(host, prompt_tokens(body.prompt.chunks, host), n, params, want, last_n)
            return proto.encode_sample([(d.stopped, d.tokens, d.logprobs) for d in drawn], prompt_lp)

        ids = [f"{sampler.id}:{body.seq_id}:{i}" for i in range(n)]
        rid = served.worker.submit(f"sample {sampler.id} ({n} x {params.max_tokens} tokens)", call,
                                   lane=sampler.session_id)
        return wire.future(rid, sample_sequence_ids=ids)


def _served_options(body: wire.Sample) -> None:
    asked = [name for name, on in (("topk_prompt_logprobs", body.topk_prompt_logprobs),
                                   ("topk_sample_logprobs", body.topk_sample_logprobs),
                                   ("target_prompt_logprobs", body.target_prompt_logprobs is not None),
                                   ("prompt_alt_tokens_k", body.prompt_alt_tokens_k),
                                   ("record_stability_info", body.record_stability_info)) if on]
    if asked:
        raise wire.Refused(f"sample: {', '.join(asked)} unsupported by forge serve (served: num_samples, "
                           "sampling_params, prompt_logprobs, prompt_logprobs_last_n)")


def _sampler_of(served: Served, body: wire.CreateSamplingSession, who: str) -> Any:
    """A maker of the sampler: of a saved checkpoint (its adapters read now; a path that does not
    exist, or is another key's, refused naming it), or of a configured base."""
    if body.model_path is not None:
        path = ckpt.parse(body.model_path, "model_path")
        record, folder = served.store.existing(path, who, "model_path")
        spec = served.cfg.find(record.base_model)
        if spec is None:
            raise wire.Refused(f"model_path {path.tinker}: its base {record.base_model!r} is no longer served here")
        weights, _ = ckpt.read_adapter(folder)
        lora = wire.LoraRequest(rank=record.rank, train_attn=record.train_attn, train_mlp=record.train_mlp,
                                train_unembed=record.train_unembed)
        adapters = Adapters(record.rank, record.alpha, targets(lora))
        return lambda sid: Sampler(sid, who, body.session_id, spec, Path(record.base), adapters, weights, path.tinker)
    if body.base_model is None:
        raise wire.Refused("create_sampling_session: give model_path (saved weights) or base_model")
    base_spec = served.cfg.find(body.base_model)
    if base_spec is None:
        raise wire.Refused(f"base_model {body.base_model!r} is not served here; served: "
                           f"{', '.join(m.name for m in served.cfg.models)}")
    base = catalog.checkpoint(base_spec.base) if base_spec.is_catalog else Path(base_spec.base).expanduser()
    return lambda sid: Sampler(sid, who, body.session_id, base_spec, base, None, None)
