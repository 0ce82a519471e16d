"""Reward functions named in a recipe, living in the customer's environment.

A source is one of:
- `path/to/file.py:function` or `package.module:function`: a Python callable, sync or async,
  `(prompts, completions, **fields) -> list[float]` (fields: the prompt rows' other columns);
- `http://...` / `https://...`: an endpoint that receives `{"prompts", "completions", **fields}` as
  JSON and returns a JSON list of scores (or `{"rewards": [...]}`), called in chunks of
  `batch_size` with a timeout, retries and at most `concurrency` requests in flight;
- `lambda:<name or ARN>`: an AWS Lambda function invoked through boto3 with the same JSON, in chunks.
Whatever the source, a call that raises, times out, returns the wrong number of scores or a
non-finite one raises RewardError naming the source and the batch.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import json
import math
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

from forge.errors import ForgeError
from forge.recipe.settings import RewardSource
from forge.usercode import load_function

Fields = dict[str, list[Any]]  # the prompt rows' other columns, one list per column


class RewardError(ForgeError):
    """A reward source failed; the message names the source and the batch."""


class Reward:
    """One reward source of a stage: call(prompts, completions, fields, batch) -> list[float]."""

    def __init__(self, spec: RewardSource, root: Path | None = None, lambda_client: Any = None):
        self.spec, self.source, self.weight = spec, spec.source, spec.weight
        self.label = reward_label(spec.source)
        self._fn = self._resolve(spec.source, root, lambda_client)

    def _resolve(self, source: str, root: Path | None, lambda_client: Any) -> Callable[..., object]:
        if source.startswith(("http://", "https://")):
            return self._http
        if source.startswith("lambda:"):
            self._lambda = lambda_client
            return self._invoke_lambda
        return load_function(source, root, "reward")

    # ------------------------------------------------------------------------- calling
    def __call__(self, prompts: list[str], completions: list[str], fields: Fields, batch: int) -> list[float]:
        where = f"reward {self.source!r} on batch {batch}"
        try:
            if self._fn in (self._http, self._invoke_lambda):
                scores = self._fn(prompts, completions, fields, where)
            else:
                scores = self._python(prompts, completions, fields)
        except RewardError:
            raise
        except (TimeoutError, cf.TimeoutError, asyncio.TimeoutError):
            raise RewardError(f"{where}: no answer within {self.spec.timeout_s:g}s (timeout_s)") from None
        except Exception as e:
            raise RewardError(f"{where}: raised {type(e).__name__}: {e}") from None
        return check_scores(scores, len(completions), where)

    # the scores are the source's answer, unchecked (`object`) until check_scores
    def _python(self, prompts: list[str], completions: list[str], fields: Fields) -> object:
        fn, timeout = self._fn, self.spec.timeout_s
        if inspect.iscoroutinefunction(fn):
            async def bounded() -> object:
                return await asyncio.wait_for(fn(prompts, completions, **fields), timeout)
            return asyncio.run(bounded())
        pool = cf.ThreadPoolExecutor(1)  # a hung function cannot be killed: it is left behind, the stage ends
        try:
            return pool.submit(fn, prompts, completions, **fields).result(timeout=timeout)
        finally:
            pool.shutdown(wait=False)

    def _chunks(self, prompts: list[str], completions: list[str], fields: Fields) -> Iterator[dict[str, list[Any]]]:
        n = self.spec.batch_size
        for i in range(0, len(completions), n):
            yield {"prompts": prompts[i:i + n], "completions": completions[i:i + n],
                   **{k: v[i:i + n] for k, v in fields.items()}}

    def _map_chunks(self, call: Callable[[dict[str, list[Any]]], object], prompts: list[str], completions: list[str],
                    fields: Fields) -> object:
        chunks = list(self._chunks(prompts, completions, fields))
        with cf.ThreadPoolExecutor(self.spec.concurrency) as pool:
            parts = list(pool.map(call, chunks))
        out: list[object] = []
        for chunk, part in zip(chunks, parts):
            if not isinstance(part, list) or len(part) != len(chunk["completions"]):
                return part if not isinstance(part, list) else out + part  # check_scores reports it
            out += part
        return out

    def _http(self, prompts: list[str], completions: list[str], fields: Fields, where: str) -> object:
        def post(chunk: dict[str, list[Any]]) -> object:
            body = json.dumps(chunk).encode()
            for attempt in range(self.spec.retries + 1):
                req = urllib.request.Request(self.source, body, {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=self.spec.timeout_s) as r:
                        data = json.loads(r.read())
                    return data["rewards"] if isinstance(data, dict) and "rewards" in data else data
                except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
                    if attempt == self.spec.retries:
                        raise RewardError(f"{where}: the endpoint failed after {attempt + 1} attempt(s): {e}") from None
                    time.sleep(min(2.0, 0.2 * 2 ** attempt))
            raise AssertionError("unreachable: the last attempt returns or raises")
        return self._map_chunks(post, prompts, completions, fields)

    def _invoke_lambda(self, prompts: list[str], completions: list[str], fields: Fields, where: str) -> object:
        client = self._lambda or _boto_lambda(self.spec.region)
        name = self.source.removeprefix("lambda:")

        def invoke(chunk: dict[str, list[Any]]) -> object:
            resp = client.invoke(FunctionName=name, InvocationType="RequestResponse", Payload=json.dumps(chunk).encode())
            payload = json.loads(resp["Payload"].read() or b"null")
            if resp.get("FunctionError"):
                raise RewardError(f"{where}: the Lambda function failed ({resp['FunctionError']}): {payload}")
            return payload["rewards"] if isinstance(payload, dict) and "rewards" in payload else payload
        return self._map_chunks(invoke, prompts, completions, fields)


def reward_label(source: str) -> str:
    """A short name for metric keys: the function of `file.py:fn` / `module:fn`, the Lambda
    function's name, or the endpoint's host and path."""
    if source.startswith(("http://", "https://")):
        label = source.split("://", 1)[1].split("?", 1)[0].rstrip("/")
    elif source.startswith("lambda:"):
        name = source.removeprefix("lambda:")  # a name, name:qualifier, or arn:aws:lambda:REGION:ACCOUNT:function:NAME
        label = name.split(":")[6] if name.startswith("arn:") and name.count(":") >= 6 else name.split(":")[0]
    else:
        label = source.rpartition(":")[2]
    return re.sub(r"[^A-Za-z0-9_./-]+", "_", label) or "reward"


def unique_labels(rewards: list["Reward"]) -> list[str]:
    """Each source's metric label, made unique (two sources may share a function name)."""
    out: list[str] = []
    for r in rewards:
        label, n = r.label, 2
        while label in out:
            label, n = f"{r.label}_{n}", n + 1
        out.append(label)
    return out


def _boto_lambda(region: str | None) -> Any:
    try:
        import boto3
    except ImportError:
        raise ForgeError("a lambda: reward needs boto3 (pip install 'forge[aws]')") from None
    return boto3.client("lambda", region_name=region)


def check_scores(scores: object, n: int, where: str) -> list[float]:
    if not isinstance(scores, (list, tuple)):
        raise RewardError(f"{where}: expected a list of {n} scores, got {type(scores).__name__}")
    if len(scores) != n:
        raise RewardError(f"{where}: returned {len(scores)} scores for {n} completions")
    out: list[float] = []
    for i, s in enumerate(scores):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise RewardError(f"{where}: score {i} is {s!r}, not a finite number")
        out.append(float(s))
    return out
