"""Weights routes: save_weights (the SDK's save_state), save_weights_for_sampler (a named
checkpoint, or a sampler of the model's current weights), load_weights (onto a model, or a new model
from a checkpoint: create_training_client_from_state*), and the REST client's training runs and
checkpoints (list, get, delete, weights_info). Paths are checked for their owner before anything
runs (forge.serve.checkpoints)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from forge.errors import ForgeError
from forge.serve import checkpoints as ckpt, wire
from forge.serve.checkpoints import CheckpointPath, RunRecord
from forge.serve.routes_train import create
from forge.serve.sampling import Sampler
from forge.serve.served import Served, owner
from forge.serve.state import ModelEntry
from forge.serve.trainer import ServedModel
from forge.serve.worker import Reply

PAGE = 20  # the SDK's default page of training runs


def routes(app: FastAPI, served: Served) -> None:
    @app.post("/api/v1/save_weights")
    async def save_weights(body: wire.SaveWeights, request: Request) -> dict[str, Any]:
        entry = served.registry.model(body.model_id, owner(request))
        path = CheckpointPath(entry.id, "weights", ckpt.check_name(body.path, "path"))
        return _save(served, entry, path, body)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(body: wire.SaveWeights, request: Request) -> dict[str, Any]:
        entry = served.registry.model(body.model_id, owner(request))
        if body.path is not None:
            return _save(served, entry, CheckpointPath(entry.id, "sampler_weights", ckpt.check_name(body.path, "path")),
                         body)
        seq, who = body.sampling_session_seq_id, owner(request)

        def snapshot() -> Reply:  # on the worker, after the calls before it: the weights as they are then
            model = _model(entry)
            weights = model.adapter_state()
            sampler = served.registry.add_sampler(entry.session_id, seq, lambda sid: Sampler(
                sid, who, entry.session_id, entry.spec, model.base, model.adapters, weights), who)
            return {"sampling_session_id": sampler.id, "type": "save_weights_for_sampler"}

        label = f"save_weights_for_sampler {entry.id} (a sampler)"
        return wire.future(served.worker.submit(label, snapshot, lane=entry.session_id), entry.id)

    @app.post("/api/v1/load_weights")
    async def load_weights(body: wire.LoadWeights, request: Request) -> dict[str, Any]:
        who, path = owner(request), ckpt.parse(body.path)
        if body.optimizer and path.kind != "weights":
            raise wire.Refused(f"path {path.tinker}: a sampler checkpoint holds no optimizer state; load it without "
                               "the optimizer, or save_state a training checkpoint")
        record, folder = served.store.existing(path, who)
        if body.model_id is not None:
            entry = served.registry.model(body.model_id, who)
            model = _model(entry)
            _fits(record, entry, path)

            def into() -> Reply:
                _load(model, folder, path, body.optimizer)
                return {"type": "load_weights", "path": path.tinker, "model_id": entry.id}

            label = f"load_weights {entry.id} <- {path.tinker}"
            return wire.future(served.worker.submit(label, into, lane=entry.session_id), entry.id)
        if body.session_id is None or body.model_seq_id is None:
            raise wire.Refused("load_weights: give model_id, or session_id and model_seq_id (a new model)")
        return _new_model(served, body, record, folder, path, who)

    @app.get("/api/v1/training_runs")
    async def training_runs(request: Request, limit: int = PAGE, offset: int = 0) -> dict[str, Any]:
        runs = served.store.runs(owner(request))
        page = runs[max(offset, 0):max(offset, 0) + max(limit, 0)]
        return {"training_runs": [_run(served, r) for r in page],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}

    @app.get("/api/v1/training_runs/{run_id}")
    async def training_run(run_id: str, request: Request) -> dict[str, Any]:
        return _run(served, served.store.owned_run(run_id, owner(request), f"training run {run_id}"))

    @app.get("/api/v1/training_runs/{run_id}/checkpoints")
    async def checkpoints(run_id: str, request: Request) -> dict[str, Any]:
        served.store.owned_run(run_id, owner(request), f"training run {run_id}")
        return {"checkpoints": served.store.listing(run_id)}

    @app.delete("/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(run_id: str, checkpoint_id: str, request: Request) -> dict[str, Any]:
        served.store.delete(ckpt.parse(f"{ckpt.PREFIX}{run_id}/{checkpoint_id}"), owner(request))
        return {}

    @app.get("/api/v1/checkpoints")
    async def user_checkpoints(request: Request, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        every = [c for r in served.store.runs(owner(request)) for c in served.store.listing(r.training_run_id)]
        page = every[max(offset, 0):max(offset, 0) + max(limit, 0)]
        return {"checkpoints": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(every)}}

    @app.post("/api/v1/weights_info")
    async def weights_info(body: wire.TinkerPath, request: Request) -> dict[str, Any]:
        record, _ = served.store.existing(ckpt.parse(body.tinker_path, "tinker_path"), owner(request), "tinker_path")
        return {"base_model": record.base_model, "optimizer_config": {"type": "adamw"}, "is_lora": True,
                "lora_rank": record.rank, "train_unembed": record.train_unembed, "train_mlp": record.train_mlp,
                "train_attn": record.train_attn}


def _model(entry: ModelEntry) -> ServedModel:
    if entry.served is None:
        raise ForgeError(f"model {entry.id}: released (its session ended)")
    return entry.served


def _save(served: Served, entry: ModelEntry, path: CheckpointPath, body: wire.SaveWeights) -> dict[str, Any]:
    """Write the checkpoint on the worker, after the model's calls before it."""
    training = path.kind == "weights"
    folder = served.store.folder(path)

    def call() -> Reply:
        model = _model(entry)
        served.store.expire(folder)  # an expired checkpoint's name is free
        if (folder / "forge_state.json").is_file() and not (training and body.overwrite):
            how = "; save_state(..., overwrite=True) replaces it" if training else "; choose another name"
            raise ForgeError(f"checkpoint {path.tinker} exists{how}")
        asked = ckpt.Asked(served.store.clock(), body.ttl_seconds, body.user_metadata)
        ckpt.write(folder, model, entry.run, entry.spec, path, training, asked)
        if entry.tracking is not None:
            entry.tracking.checkpoint(path.tinker, str(folder), model.steps)
            if training:  # the weights kind: a registered model's new version where the config names one
                entry.tracking.register(folder, path.tinker, model.steps)
        return {"path": path.tinker, "type": "save_weights" if training else "save_weights_for_sampler"}

    label = f"{'save_weights' if training else 'save_weights_for_sampler'} {path.tinker}"
    return wire.future(served.worker.submit(label, call, lane=entry.session_id), entry.id)


def _fits(record: RunRecord, entry: ModelEntry, path: CheckpointPath) -> None:
    lora = entry.lora
    mine = (lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)
    theirs = (record.rank, record.train_attn, record.train_mlp, record.train_unembed)
    if mine != theirs:
        raise wire.Refused(f"path {path.tinker}: its adapters (rank, attn, mlp, unembed = {theirs}) do not fit model "
                           f"{entry.id} ({mine}); create_training_client_from_state makes a model that fits")


def _load(model: ServedModel, folder: Path, path: CheckpointPath, optimizer: bool) -> None:
    adapter, _ = ckpt.read_adapter(folder)
    saved = ckpt.read_optimizer(folder, path) if optimizer else None
    model.load(adapter, saved, ckpt.step_of(folder) if optimizer else model.steps)


def _new_model(served: Served, body: wire.LoadWeights, record: RunRecord, folder: Path, path: CheckpointPath,
               who: str) -> dict[str, Any]:
    """A new model of the session, with the checkpoint's base and LoRA shape, then its weights."""
    name = body.base_model or record.base_model
    spec = served.cfg.find(name)
    if spec is None:
        raise wire.Refused(f"path {path.tinker}: its base {name!r} is not served here; served: "
                           f"{', '.join(m.name for m in served.cfg.models)}")
    if body.optimizer_config is not None and body.optimizer_config.type != "adamw":
        raise wire.Refused(f"optimizer_config.type {body.optimizer_config.type!r} is unsupported: forge serve "
                           "trains with adamw")
    lora = wire.LoraRequest(rank=record.rank, train_attn=record.train_attn, train_mlp=record.train_mlp,
                            train_unembed=record.train_unembed)
    assert body.session_id is not None and body.model_seq_id is not None
    entry, new = served.registry.add_model(body.session_id, body.model_seq_id, spec, lora, who)
    if new:
        def call() -> Reply:
            create(served, entry, record.alpha, None, path.tinker)
            try:
                _load(_model(entry), folder, path, body.optimizer)
            except Exception as e:
                entry.failed = f"loading {path.tinker} failed: {e}"
                raise
            return {"type": "load_weights", "path": path.tinker, "model_id": entry.id}

        entry.create_request = served.worker.submit(f"load_weights {entry.id} <- {path.tinker}", call,
                                                    lane=entry.session_id)
    return wire.future(entry.create_request, entry.id)


def _run(served: Served, record: RunRecord) -> dict[str, Any]:
    """tinker.types.TrainingRun of a run record."""
    listed = served.store.listing(record.training_run_id)
    last = {kind: next((c for c in reversed(listed) if c["checkpoint_type"] == kind), None)
            for kind in ("training", "sampler")}
    times = [record.created, *(c["time"] for c in listed)]
    return {"training_run_id": record.training_run_id, "base_model": record.base_model, "model_owner": record.owner,
            "is_lora": True, "corrupted": False, "lora_rank": record.rank, "last_request_time": max(times),
            "last_checkpoint": last["training"], "last_sampler_checkpoint": last["sampler"], "user_metadata": None}
