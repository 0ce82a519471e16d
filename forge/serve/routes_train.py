"""Training routes: create_model, get_info, forward_backward (protobuf), optim_step; and loading a
served model (shared with load_weights, which makes a model from a checkpoint)."""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from google.protobuf.message import DecodeError

from forge import catalog
from forge.serve import batch as batching, losses, proto, wire
from forge.serve.checkpoints import RunRecord, now
from forge.serve.served import Served, owner
from forge.serve.state import ModelEntry
from forge.serve.trainer import ServedModel, Settings, targets
from forge.serve.worker import Reply

PROTO = "application/x-protobuf"


def routes(app: FastAPI, served: Served) -> None:
    @app.post("/api/v1/create_model")
    async def create_model(body: wire.CreateModel, request: Request) -> dict[str, Any]:
        spec = served.cfg.find(body.base_model)
        if spec is None:
            names = ", ".join(m.name for m in served.cfg.models)
            raise wire.Refused(f"base_model {body.base_model!r} is not served here; served: {names}")
        if body.lora_config is None:
            raise wire.Refused("lora_config: required; forge serve trains LoRA adapters (full fine-tuning is "
                               "unsupported)")
        if body.optimizer_config.type != "adamw":
            raise wire.Refused(f"optimizer_config.type {body.optimizer_config.type!r} is unsupported: forge serve "
                               "trains with adamw")
        targets(body.lora_config)
        entry, new = served.registry.add_model(body.session_id, body.model_seq_id, spec, body.lora_config,
                                               owner(request))
        if new:
            lora = body.lora_config
            entry.create_request = served.worker.submit(
                f"create_model {entry.id}", lambda: create(served, entry, served.cfg.lora_alpha, lora.seed, None),
                lane=entry.session_id)
        return wire.future(entry.create_request, entry.id)

    @app.post("/api/v1/get_info")
    async def get_info(body: wire.ModelRef, request: Request) -> dict[str, Any]:
        entry = served.registry.model(body.model_id, owner(request))
        return {"type": "get_info", "model_id": entry.id, "optimizer_config": {"type": "adamw"}, **entry.info}

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if request.headers.get("content-encoding", "identity") != "identity":
            raise wire.Refused(f"Content-Encoding {request.headers['content-encoding']}: send the body uncompressed")
        if PROTO not in request.headers.get("content-type", ""):
            raise wire.Refused(f"forward_backward: send the request as {PROTO} (the Tinker SDK's encoding)")
        try:
            msg = proto.parse_request(await request.body())
        except DecodeError as e:
            raise wire.Refused(f"forward_backward: the body is not a ForwardBackwardRequest message ({e})") from None
        entry = served.registry.model(msg.model_id, owner(request))
        config = {**dict(msg.loss_fn_config), **{k: v.number for k, v in msg.loss_fn_config_v2.items()}}
        fn = losses.loss_fn(msg.loss_fn, config)
        model = entry.served
        assert model is not None  # registry.model answers loaded models only
        items = batching.examples(msg, model.limits, fn, config)
        backward, seq = not msg.forward_only, int(msg.seq_id)
        label = f"{'forward_backward' if backward else 'forward'} {entry.id} ({len(items)} datums, {fn.name})"

        def call() -> Reply:
            out = model.forward_backward(items, seq, backward, fn)
            return proto.encode_output({"logprobs": out.logprobs, "elementwise_loss": out.losses},
                                       {"loss:sum": out.loss_sum})

        return wire.future(served.worker.submit(label, call, lane=entry.session_id), entry.id)

    @app.post("/api/v1/optim_step")
    async def optim_step(body: wire.OptimStep, request: Request) -> dict[str, Any]:
        entry = served.registry.model(body.model_id, owner(request))
        if body.optim_params.type not in (None, "adamw"):
            raise wire.Refused(f"optim_step: optimizer {body.optim_params.type!r} is unsupported; forge serve "
                               "trains with AdamW")
        model, params = entry.served, body.optim_params
        assert model is not None

        def call() -> Reply:
            metrics = model.optim_step(params)
            if entry.tracking is not None:
                entry.tracking.step(model.steps, metrics)
            return {"metrics": metrics}

        return wire.future(served.worker.submit(f"optim_step {entry.id}", call, lane=entry.session_id), entry.id)


def create(served: Served, entry: ModelEntry, alpha: float, seed: int | None, resumed_from: str | None) -> Reply:
    """Load the model (on the worker); a base that does not load (the server's config, not the
    client's request: a server error) fails the future and every later call on the model, saying why."""
    try:
        load(served, entry, alpha, seed, resumed_from)
    except Exception as e:
        entry.failed = f"base {entry.spec.name!r} ({entry.spec.base}) did not load: {type(e).__name__}: {e}"
        raise RuntimeError(entry.failed) from e
    return {"type": "create_model", "model_id": entry.id}


def load(served: Served, entry: ModelEntry, alpha: float, seed: int | None, resumed_from: str | None) -> ServedModel:
    """Load the base (a catalog phase downloads once), add the adapters, fill get_info's facts,
    record the training run (run.json) and open its MLflow run when tracked."""
    spec = entry.spec
    base = catalog.checkpoint(spec.base) if spec.is_catalog else Path(spec.base).expanduser()
    settings = Settings(name=f"model {entry.id}", precision=served.cfg.precision,
                        seed=seed if seed is not None else secrets.randbits(31))  # the SDK: None is random
    folder = served.workdir / "models" / entry.id.replace(":", "-")
    model = ServedModel.open(base, entry.lora, alpha, settings, folder)
    arch = (getattr(model.session.unwrapped().config, "architectures", None) or [None])[0]
    entry.info = {"model_data": {"arch": arch, "model_name": spec.name, "tokenizer_id": spec.tokenizer_id or str(base)},
                  "is_lora": True, "lora_rank": entry.lora.rank, "model_name": spec.name}
    lora = entry.lora
    entry.run = RunRecord(training_run_id=entry.id, owner=entry.owner, base_model=spec.name, base=str(base),
                          rank=lora.rank, alpha=alpha, train_attn=lora.train_attn, train_mlp=lora.train_mlp,
                          train_unembed=lora.train_unembed, created=now(), resumed_from=resumed_from)
    served.store.add_run(entry.run)
    if served.cfg.tracking is not None:
        from forge.serve.tracking import RunLog

        params = {"base_model": spec.name, "base": str(base), "lora.rank": lora.rank, "lora.alpha": alpha,
                  "lora.targets": ",".join(model.adapters.target_modules), "seed": settings.seed,
                  "precision": served.cfg.precision, "resumed_from": resumed_from or ""}
        entry.tracking = RunLog(served.cfg.tracking, entry.id, {"forge.serve.model_id": entry.id,
                                                                "forge.serve.base_model": spec.name}, params,
                                served.workdir)
    entry.served = model
    return model
