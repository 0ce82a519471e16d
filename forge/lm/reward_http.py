"""The http transport (`http://...` / `https://...`): each request of a contract's payload POSTed as
JSON, `batch_size` completions a request, at most `concurrency` in flight, failed attempts retried
`retries` times, all within the call's one deadline (`timeout_s`). Redirects are not followed (a
reward's prompts would go where the answer points) and an answer is at most MAX_RESPONSE_BYTES."""
from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any

from forge.lm.reward_channel import Chunk, Chunked, ContractCode, Deadline, RewardError, Setup, map_chunks
from forge.recipe.rft_settings import RewardSource
from forge.scrub import scrub

MAX_RESPONSE_BYTES = 64 * 2**20  # an HTTP answer larger than this fails the call


class _Final(ValueError):
    """An answer that another attempt would not change: over MAX_RESPONSE_BYTES, or a redirect."""


class Endpoint:
    def __init__(self, spec: RewardSource):
        self.spec, self.url = spec, spec.source

    def send(self, payload: Any, contract: ContractCode, where: str) -> object:
        deadline, retries = Deadline(self.spec.timeout_s), self.spec.retries

        def post(chunk: Chunk) -> object:
            body = json.dumps(chunk).encode()
            for attempt in range(retries + 1):  # retries count against the call's one deadline
                try:
                    return json.loads(_post(self.url, body, deadline))
                except (OSError, http.client.HTTPException, ValueError) as e:
                    if deadline.left() <= 0:
                        raise TimeoutError from None
                    if attempt == retries or isinstance(e, _Final):
                        raise RewardError(f"{where}: the endpoint failed after {attempt + 1} attempt(s): "
                                          f"{str(e) or type(e).__name__}") from None
                    time.sleep(max(0.0, min(2.0, 0.2 * 2 ** attempt, deadline.left())))
            raise AssertionError("unreachable: the last attempt returns or raises")
        chunks = contract.split(payload, self.spec.batch_size)
        return map_chunks(post, Chunked(contract, chunks, self.spec.concurrency), deadline)

    def close(self) -> None:
        return None


def endpoint(spec: RewardSource, setup: Setup) -> Endpoint:
    return Endpoint(spec)


def _post(url: str, body: bytes, deadline: Deadline) -> bytes:
    """POST `body` as JSON and read the whole answer, all within the deadline."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    left = deadline.left()
    if left <= 0 or deadline.aborted:
        raise TimeoutError
    conn = kind(parts.hostname or "", parts.port, timeout=left)
    try:
        conn.connect()
        if conn.sock is not None:
            deadline.watch(conn.sock)
        path = parts.path or "/"
        conn.request("POST", f"{path}?{parts.query}" if parts.query else path, body,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if 300 <= resp.status < 400:  # followed, a reward's prompts would go where the answer points
            where = scrub(resp.getheader("Location") or "(no Location)")
            raise _Final(f"HTTP {resp.status} {resp.reason}: a redirect to {where}; forge does not follow redirects "
                         "for rewards: set the source to the URL that answers")
        if resp.status >= 400:
            raise http.client.HTTPException(f"HTTP Error {resp.status}: {resp.reason}")
        out = bytearray()
        while chunk := resp.read(2**16):
            out += chunk
            if len(out) > MAX_RESPONSE_BYTES:
                raise _Final(f"the answer is over {MAX_RESPONSE_BYTES // 2**20} MiB")
        if deadline.aborted:
            raise TimeoutError
        return bytes(out)
    finally:
        conn.close()
