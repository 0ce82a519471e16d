"""Sessions and the models and samplers made in them. A session lives while its client heartbeats
(the SDK sends one every 10 s); one silent for `timeout_s`, or finished by its client, ends, and
its models and samplers are released. A session belongs to the API key that made it (its
fingerprint, never the key): another key's calls on it, its models or its samplers are refused.
Read and written from the HTTP loop and the worker thread, under one lock."""
from __future__ import annotations

import hashlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from forge.serve.config import BaseSpec
from forge.serve.sampling import Sampler
from forge.serve.trainer import ServedModel
from forge.serve.wire import LoraRequest, Refused

SNAPSHOTS = 16  # samplers of a session's current weights kept (an RL loop makes one per step); older ones end


def fingerprint(key: str) -> str:
    """Who a key is, as sessions and checkpoints record it: a hash, so no file or log holds the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class ClientSession:
    id: str
    owner: str
    last_seen: float
    ended: str | None = None  # why it ended: "finished by its client", "no heartbeat for N s"
    models: dict[int, str] = field(default_factory=dict)    # model_seq_id -> model id
    samplers: dict[int, str] = field(default_factory=dict)  # sampling_session_seq_id -> sampler id


@dataclass
class ModelEntry:
    id: str
    session_id: str
    owner: str
    spec: BaseSpec
    lora: LoraRequest
    create_request: str = ""          # the create_model future (a retried create answers it again)
    served: ServedModel | None = None  # set by the worker once the model is loaded
    failed: str | None = None          # why loading it failed
    info: dict[str, Any] = field(default_factory=dict)  # get_info's model_data and lora facts
    run: Any = None                    # forge.serve.checkpoints.RunRecord, once loaded
    tracking: Any = None               # forge.serve.tracking.RunLog when the config tracks runs


class Registry:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s, self.clock = timeout_s, clock
        self.lock = threading.Lock()
        self.sessions: dict[str, ClientSession] = {}
        self.models: dict[str, ModelEntry] = {}
        self.samplers: dict[str, Sampler] = {}

    def new_session(self, owner: str) -> str:
        with self.lock:
            sid = str(uuid.uuid4())
            self.sessions[sid] = ClientSession(sid, owner, self.clock())
            return sid

    def _live(self, session_id: str, owner: str) -> ClientSession:
        s = self.sessions.get(session_id)
        if s is None:
            raise Refused(f"session_id {session_id!r}: no such session (create one with create_session)", 404)
        if s.owner != owner:
            raise Refused(f"session {session_id}: belongs to another API key's client", 403)
        if s.ended:
            raise Refused(f"session {session_id} has ended ({s.ended}); start a new ServiceClient", 410)
        return s

    def session(self, session_id: str, owner: str) -> ClientSession:
        with self.lock:
            s = self._live(session_id, owner)
            s.last_seen = self.clock()
            return s

    def heartbeat(self, session_id: str, owner: str) -> None:
        self.session(session_id, owner)

    def add_model(self, session_id: str, seq: int, spec: BaseSpec, lora: LoraRequest,
                  owner: str) -> tuple[ModelEntry, bool]:
        """(the session's model number `seq`, whether it is new): a retried create_model finds its model."""
        with self.lock:
            s = self._live(session_id, owner)
            s.last_seen = self.clock()
            if seq in s.models:
                return self.models[s.models[seq]], False
            entry = ModelEntry(f"{session_id}:train:{seq}", session_id, owner, spec, lora)
            s.models[seq] = entry.id
            self.models[entry.id] = entry
            return entry, True

    def model(self, model_id: str, owner: str) -> ModelEntry:
        """A loaded model of a live session of this key, else Refused naming why."""
        with self.lock:
            entry = self.models.get(model_id)
            if entry is None:
                raise Refused(f"model_id {model_id!r}: no such model (create one with create_model)", 404)
            self._live(entry.session_id, owner).last_seen = self.clock()  # a call shows the client is there
            if entry.failed is not None:
                raise Refused(f"model_id {model_id}: create_model failed ({entry.failed})")
            if entry.served is None:
                raise Refused(f"model_id {model_id}: still being created; wait for create_model's future")
            return entry

    def add_sampler(self, session_id: str, seq: int | None, make: Callable[[str], Sampler], owner: str) -> Sampler:
        """The session's sampler number `seq` (a retried request finds it), made by `make(id)` when new."""
        with self.lock:
            s = self._live(session_id, owner)
            if seq is not None and s.samplers.get(seq) in self.samplers:
                return self.samplers[s.samplers[seq]]
            sampler = make(f"{session_id}:sample:{seq if seq is not None else uuid.uuid4().hex[:8]}")
            if seq is not None:
                s.samplers[seq] = sampler.id
            self.samplers[sampler.id] = sampler
            snapshots = [x for x in self.samplers.values()
                         if x.session_id == session_id and x.model_path is None and x.weights is not None]
            for old in snapshots[:-SNAPSHOTS]:  # oldest first (insertion order)
                del self.samplers[old.id]
            return sampler

    def sampler(self, sampler_id: str, owner: str) -> Sampler:
        with self.lock:
            sampler = self.samplers.get(sampler_id)
            if sampler is None:
                raise Refused(f"sampling_session_id {sampler_id!r}: no such sampler (create one with "
                              "create_sampling_client or save_weights_and_get_sampling_client; a session keeps "
                              f"the last {SNAPSHOTS} of the latter)", 404)
            self._live(sampler.session_id, owner).last_seen = self.clock()
            return sampler

    def end(self, session_id: str, why: str, owner: str) -> list[ModelEntry]:
        """End a session (the first reason stays, as the SDK's finish expects); the models to release."""
        with self.lock:
            s = self.sessions.get(session_id)
            if s is None:
                raise Refused(f"session_id {session_id!r}: no such session", 404)
            if s.owner != owner:
                raise Refused(f"session {session_id}: belongs to another API key's client", 403)
            return [] if s.ended else self._end(s, why)

    def _end(self, s: ClientSession, why: str) -> list[ModelEntry]:
        s.ended = why  # its entries stay, without their models, so that a late call learns why
        for sampler_id in s.samplers.values():
            self.samplers.pop(sampler_id, None)
        for sampler in [x for x in self.samplers.values() if x.session_id == s.id]:  # those without a seq
            del self.samplers[sampler.id]
        return [self.models[m] for m in s.models.values()]

    def end_all(self, why: str) -> list[ModelEntry]:
        """End every live session (the server stops); the models to release."""
        with self.lock:
            return [e for s in self.sessions.values() if not s.ended for e in self._end(s, why)]

    def sweep(self) -> list[ModelEntry]:
        """End the sessions silent for longer than the timeout; the models to release."""
        now, released = self.clock(), []
        with self.lock:
            for s in self.sessions.values():
                if not s.ended and now - s.last_seen > self.timeout_s:
                    released += self._end(s, f"no heartbeat for {self.timeout_s:g} s")
        return released
