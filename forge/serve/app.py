"""The HTTP routes the Tinker SDK calls (paths and shapes read from its tinker/resources/ and
tinker/types/), the API-key check in front of them, and the long poll of futures.

Every route but /api/v1/healthz needs a configured key in X-API-Key (refused: 401, which the SDK
raises as AuthenticationError); keys are compared in constant time and never logged or echoed.
A key's sessions, models, samplers and checkpoints are its own: another key's are refused (403).
A call the SDK knows but forge serve does not serve answers 400 "unsupported" naming it (not 404
or 5xx: the SDK retries 5xx for minutes). The routes themselves: routes_train.py,
routes_weights.py, routes_sample.py."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from forge import catalog
from forge.serve import routes_sample, routes_train, routes_weights, wire
from forge.serve.checkpoints import Store
from forge.serve.config import ServeConfig
from forge.serve.sampling import Hosts
from forge.serve.served import Served, owner, release
from forge.serve.state import Registry, fingerprint
from forge.serve.worker import Worker

OPEN = frozenset({"/api/v1/healthz"})  # answered without a key (liveness probes)
POLL_S = 20.0  # a retrieve_future waits this long for its result (the SDK's own timeout is 45 s)
PROTO = "application/x-protobuf"
# the flags the SDK fetches first (tinker.types.ClientConfigResponse): plain API keys, no zstd
# bodies, forward_backward chunks sent together, custom losses computed client-side (over forward
# and cross_entropy, both served), per-request futures, no join of sampling sessions
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "proto_compress_fwdbwd": False,
                 "parallel_fwdbwd_chunks": True, "custom_loss_server_side": False,
                 "sample_use_retrieve_futures": False, "sample_join_sampling_session": False}


def capabilities(cfg: ServeConfig) -> list[dict[str, Any]]:
    """get_server_capabilities' supported_models: each configured base, trainable and sampleable."""
    out = []
    for m in cfg.models:
        if m.is_catalog:
            context = catalog.resolve(m.base).context
        else:
            context = json.loads((Path(m.base).expanduser() / "config.json").read_text()).get("max_position_embeddings")
        out.append({"model_name": m.name, "max_context_length": context, "trainable": True, "sampleable": True})
    return out


def create_app(cfg: ServeConfig) -> FastAPI:
    workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="forge-serve-"))
    if cfg.tracking is not None:
        from forge.serve.tracking import open_store

        open_store(cfg.tracking)
    store = Store(cfg.checkpoint_dir or workdir / "checkpoints")
    store.sweep()  # checkpoints whose ttl_seconds ran out while no server ran
    served = Served(cfg, cfg.keys(), Registry(cfg.session_timeout_s), Worker(), workdir, capabilities(cfg), store,
                    Hosts(cfg.precision))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        served.worker.start()
        yield
        release(served, served.registry.end_all("the server stopped"))
        await asyncio.to_thread(served.worker.stop)
        for entry in list(served.registry.models.values()):  # every MLflow run ends once its records are written
            if entry.tracking is not None:
                await asyncio.to_thread(entry.tracking.close)
        if cfg.workdir is None:  # the scratch folder this server made for itself
            shutil.rmtree(workdir, ignore_errors=True)

    app = FastAPI(title="forge serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served

    @app.middleware("http")
    async def api_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        key = request.headers.get("x-api-key")
        if request.url.path not in OPEN:
            if not _known(key, served.keys):
                return JSONResponse({"detail": "missing or unknown API key: send a configured key in X-API-Key"}, 401)
            request.state.owner = fingerprint(key or "")
        release(served, served.registry.sweep())  # sessions silent too long end before any call reads them
        response = await call_next(request)
        if store.expired_seen:  # deleted on the worker: never beside a save or a load of the same folder
            store.expired_seen = False
            served.worker.submit("delete expired checkpoints", lambda: {"deleted": [str(f) for f in store.sweep()]})
        return response

    @app.exception_handler(wire.Refused)
    async def refused(request: Request, e: wire.Refused) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, e.status)

    _session_routes(app, served)
    routes_train.routes(app, served)
    routes_weights.routes(app, served)
    routes_sample.routes(app, served)
    _future_routes(app, served)  # last: its catch-all answers what no route above serves
    return app


def _known(given: str | None, keys: frozenset[str]) -> bool:
    if not given:
        return False
    hits = [hmac.compare_digest(given.encode(), k.encode()) for k in keys]  # each key compared, in constant time
    return any(hits)


def _session_routes(app: FastAPI, served: Served) -> None:
    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}  # the SDK's defaults

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}  # not read: SDK telemetry may carry request headers, the key among them

    @app.get("/api/v1/get_server_capabilities")
    async def get_server_capabilities() -> dict[str, Any]:
        return {"supported_models": served.capabilities}

    @app.post("/api/v1/create_session")
    async def create_session(body: wire.CreateSession, request: Request) -> dict[str, Any]:
        return {"type": "create_session", "session_id": served.registry.new_session(owner(request))}

    @app.post("/api/v1/session_heartbeat")
    async def session_heartbeat(body: wire.SessionRef, request: Request) -> dict[str, Any]:
        served.registry.heartbeat(body.session_id, owner(request))
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> dict[str, Any]:
        release(served, served.registry.end(session_id, "finished by its client", owner(request)))
        return {}


def _future_routes(app: FastAPI, served: Served) -> None:
    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(body: wire.RetrieveFuture) -> Response:
        fut = served.worker.future(body.request_id)
        if fut is None:
            raise wire.Refused(f"request_id {body.request_id!r}: no such future (or it was answered long ago)", 404)
        await asyncio.wait([asyncio.wrap_future(fut)], timeout=POLL_S)  # never cancels the call itself
        if not fut.done():
            return JSONResponse(wire.try_again(body.request_id))
        reply = fut.result()
        return Response(reply, media_type=PROTO) if isinstance(reply, bytes) else JSONResponse(reply)

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_served(rest: str, request: Request) -> Response:
        raise wire.Refused(f"{request.method} /api/v1/{rest} is unsupported by forge serve (docs/SERVE.md lists "
                           "what is served)")
