"""Reward functions named in a recipe, living in the customer's environment.

A source is one of:
- `path/to/file.py:function` or `package.module:function`: a Python callable, sync or async,
  `(prompts, completions, **fields) -> list[float]` (fields: the prompt rows' other columns), run in
  a worker process of its own (forge.lm.reward_workers) that is killed when a call overruns;
- `http://...` / `https://...`: an endpoint that receives `{"prompts", "completions", **fields}` as
  JSON and returns a JSON list of scores (or `{"rewards": [...]}`), called in chunks of
  `batch_size`, at most `concurrency` requests in flight, failed attempts retried `retries` times;
- `lambda:<name or ARN>`: an AWS Lambda function invoked through boto3 with the same JSON, in chunks
  (botocore's connect and read timeouts are `timeout_s`).
With `protocol: nova` the same three sources speak Amazon Nova's reward contract instead
(forge.lm.nova_reward): a local `file.py:lambda_handler`, a Lambda or an endpoint gets Nova's event
(a list of samples, `batch_size` a request) and answers with Nova's results; `aggregate_reward_score`
is the score and the `metrics_list` values are kept in `metrics` for the stage to log.
- `judge:<address>`: an LLM judge (forge.lm.judges) grading each completion, or each prompt's group,
  with the source's `judge:` rubric; its verdicts are cached in `cache_dir` (the run folder).
`timeout_s` bounds the whole call, whatever the source: every chunk and every retry of an HTTP
source, the Python function however it blocks. Scores are numbers (numpy's too; not booleans);
a numpy array counts as the list. A call that raises, exits, crashes, times out, returns the wrong
number of scores or a non-finite one raises RewardError naming the source and the batch.
"""
from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

from forge.errors import ForgeError
from forge.lm.nova_reward import Answer, event, number_problem, read_answer
from forge.lm.reward_workers import Interrupted, RewardWorker, WorkerFailed, WorkerTimeout, interruptible
from forge.recipe.judge import JUDGE_PREFIX, JudgeOptions
from forge.recipe.rft_settings import RewardSource
from forge.scrub import scrub
from forge.usercode import split_spec

Fields = dict[str, list[Any]]  # the prompt rows' other columns, one list per column
Chunk = Any  # one request's payload: forge's {"prompts", "completions", **fields} or a list of Nova samples
MAX_RESPONSE_BYTES = 64 * 2**20  # an HTTP answer larger than this fails the call


class RewardError(ForgeError):
    """A reward source failed; the message names the source and the batch."""


class RewardStopped(RewardError):
    """SIGINT/SIGTERM arrived while a reward ran: the call was abandoned (its worker ended)."""

    stopped_on_request = True  # forge.track ends the runs KILLED, not FAILED


class Reward:
    """One reward source of a stage: call(prompts, completions, fields, batch) -> list[float].
    A Python source starts its worker process here (a bad file or module fails at once); `close()`
    (or the `with` block) ends it."""

    def __init__(self, spec: RewardSource, root: Path | None = None, lambda_client: Any = None,
                 cache_dir: Path | None = None):
        self.spec, self.source, self.weight = spec, spec.source, spec.weight
        self.label = reward_label(spec.source)
        self._lambda, self._worker, self._judge = lambda_client, None, None  # lambda_client: a judge's Bedrock client too
        self.nova = spec.protocol == "nova"
        self.metrics: dict[str, list[float | None]] = {}  # nova: the last call's metrics_list values, by type.name
        if spec.source.startswith(JUDGE_PREFIX):
            from forge.lm.judges import Judge, Reach  # torch and transformers: only when a judge is named

            reach = Reach(spec.timeout_s, spec.retries, spec.region, lambda_client)
            self._judge = Judge(spec.source, spec.judge or JudgeOptions.model_validate({}), cache_dir, reach)
            self.label = f"judge_{self._judge.rubric.name}"
        elif not spec.source.startswith(("http://", "https://", "lambda:")):
            split_spec(spec.source, "reward")
            self._worker = RewardWorker(spec.source, None if root is None else str(root))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._judge is not None:
            self._judge.close()

    def __enter__(self) -> Reward:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------------- calling
    def __call__(self, prompts: list[str], completions: list[str], fields: Fields, batch: int,
                 messages: list[list[dict[str, Any]]] | None = None) -> list[float]:
        """Scores of the completions; `messages` are their prompts as chat messages (Nova's event
        carries them; by default each prompt is one user turn)."""
        where = f"reward {self.source!r} on batch {batch}"
        if self._judge is not None:
            try:
                return check_scores(self._judge.score(prompts, completions, fields), len(completions), where)
            except RewardError:
                raise
            except ForgeError as e:
                raise RewardError(f"{where}: {e}") from None
        if self.nova:
            chats = messages or [[{"role": "user", "content": p}] for p in prompts]
            samples = event(completions, chats, fields, batch)
            answer = read_answer(self.send(samples, where), [s["id"] for s in samples])
            return self._nova_scores(answer, where)
        return check_scores(self.send((prompts, completions, fields), where), len(completions), where)

    def _nova_scores(self, answer: Answer, where: str) -> list[float]:
        if answer.problems:
            more = f" (and {len(answer.problems) - 3} more; forge reward verify lists them all)" \
                if len(answer.problems) > 3 else ""
            raise RewardError(f"{where}: the answer breaks Nova's reward contract: {'; '.join(answer.problems[:3])}{more}")
        self.metrics = answer.metrics
        return [float(s) for s in answer.scores if s is not None]

    def send(self, payload: Any, where: str) -> object:
        """The source's raw answer to `payload`: a Nova event (a list of samples), else (prompts,
        completions, fields); joined over its requests. Every failure is a RewardError naming the
        source and the batch."""
        try:
            if self._worker is not None:
                if self.nova:
                    return self._worker.call_event(payload, self.spec.timeout_s)
                prompts, completions, fields = payload
                return self._worker.call(prompts, completions, fields, self.spec.timeout_s)
            chunks = self._split(payload) if self.nova else self._chunks(*payload)
            if self.source.startswith("lambda:"):
                return self._invoke_lambda(chunks, where)
            return self._http(chunks, where)
        except RewardError:
            raise
        except Interrupted as e:
            raise RewardStopped(f"{where}: stopped by {e} while the reward was running (its call was abandoned; "
                                "nothing since the last checkpoint is kept)") from None
        except (TimeoutError, cf.TimeoutError, WorkerTimeout):
            raise RewardError(f"{where}: no answer within {self.spec.timeout_s:g}s (timeout_s)") from None
        except WorkerFailed as e:
            raise RewardError(f"{where}: {e}") from None
        except Exception as e:
            raise RewardError(f"{where}: raised {type(e).__name__}: {e}") from None

    def _chunks(self, prompts: list[str], completions: list[str], fields: Fields) -> list[dict[str, list[Any]]]:
        n = self.spec.batch_size
        return [{"prompts": prompts[i:i + n], "completions": completions[i:i + n],
                 **{k: v[i:i + n] for k, v in fields.items()}} for i in range(0, len(completions), n)]

    def _split(self, samples: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        n = self.spec.batch_size
        return [samples[i:i + n] for i in range(0, len(samples), n)]

    def _map_chunks(self, call: Callable[[Chunk], object], chunks: list[Chunk], deadline: Deadline) -> object:
        """Each chunk's answer, joined; TimeoutError when they are not all in by the deadline (the
        connections still open are then shut, so no thread outlives the call for long)."""
        pool = cf.ThreadPoolExecutor(self.spec.concurrency, thread_name_prefix="forge-reward")
        futures = [pool.submit(call, chunk) for chunk in chunks]
        try:
            with interruptible():
                done, pending = cf.wait(futures, timeout=max(0.0, deadline.left()))
            if pending:
                raise TimeoutError
            parts = [f.result() for f in futures]
        finally:
            deadline.abort()
            pool.shutdown(wait=False, cancel_futures=True)
        out: list[object] = []
        for chunk, part in zip(chunks, parts):
            if not isinstance(part, list) or len(part) != len(chunk if self.nova else chunk["completions"]):
                return part if not isinstance(part, list) else out + part  # check_scores reports it
            out += part
        return out

    def _http(self, chunks: list[Chunk], where: str) -> object:
        deadline = Deadline(self.spec.timeout_s)

        def post(chunk: Chunk) -> object:
            body = json.dumps(chunk).encode()
            for attempt in range(self.spec.retries + 1):  # retries count against the call's one deadline
                try:
                    data = json.loads(_post(self.source, body, deadline))
                    return data["rewards"] if not self.nova and isinstance(data, dict) and "rewards" in data else data
                except (OSError, http.client.HTTPException, ValueError) as e:
                    if deadline.left() <= 0:
                        raise TimeoutError from None
                    if attempt == self.spec.retries or isinstance(e, _Final):
                        raise RewardError(f"{where}: the endpoint failed after {attempt + 1} attempt(s): "
                                          f"{str(e) or type(e).__name__}") from None
                    time.sleep(max(0.0, min(2.0, 0.2 * 2 ** attempt, deadline.left())))
            raise AssertionError("unreachable: the last attempt returns or raises")
        return self._map_chunks(post, chunks, deadline)

    def _invoke_lambda(self, chunks: list[Chunk], where: str) -> object:
        client = self._lambda or _boto_lambda(self.spec, where)
        name = self.source.removeprefix("lambda:")

        def invoke(chunk: Chunk) -> object:
            resp = client.invoke(FunctionName=name, InvocationType="RequestResponse", Payload=json.dumps(chunk).encode())
            payload = json.loads(resp["Payload"].read() or b"null")
            if resp.get("FunctionError"):
                raise RewardError(f"{where}: the Lambda function failed ({resp['FunctionError']}): {payload}")
            return payload["rewards"] if not self.nova and isinstance(payload, dict) and "rewards" in payload else payload
        return self._map_chunks(invoke, chunks, Deadline(self.spec.timeout_s))


class Deadline:
    """One call's wall-clock deadline. The sockets of its requests are registered; at the deadline
    (a timer) or on abort() they are shut down, which ends any read blocked on them."""

    def __init__(self, seconds: float):
        self.end, self.aborted = time.monotonic() + seconds, False
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self.abort)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return self.end - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.add(sock)
            if not self.aborted:
                return
        _shut(sock)

    def abort(self) -> None:
        self._timer.cancel()
        with self._lock:
            self.aborted, socks = True, list(self._socks)
        for sock in socks:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Final(ValueError):
    """An answer that another attempt would not change: over MAX_RESPONSE_BYTES, or a redirect."""


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


def reward_label(source: str) -> str:
    """A short name for metric keys: the function of `file.py:fn` / `module:fn` (the file's or
    module's name for a `lambda_handler`), the Lambda function's name, or the endpoint's host and path."""
    if source.startswith(("http://", "https://")):
        authority, slash, path = source.split("://", 1)[1].split("?", 1)[0].partition("/")
        label = (authority.rpartition("@")[2] + slash + path).rstrip("/")  # never the user info: a password
    elif source.startswith("lambda:"):
        name = source.removeprefix("lambda:")  # a name, name:qualifier, or arn:aws:lambda:REGION:ACCOUNT:function:NAME
        label = name.split(":")[6] if name.startswith("arn:") and name.count(":") >= 6 else name.split(":")[0]
    else:
        target, _, label = source.rpartition(":")
        if label == "lambda_handler":  # Nova's handler name says nothing: the file's (or module's) name does
            label = Path(target).stem if target.endswith(".py") else target.rpartition(".")[2]
    return re.sub(r"[^A-Za-z0-9_./-]+", "_", label) or "reward"


def unique_labels(rewards: list[Reward]) -> list[str]:
    """Each source's metric label, made unique (two sources may share a function name)."""
    out: list[str] = []
    for r in rewards:
        label, n = r.label, 2
        while label in out:
            label, n = f"{r.label}_{n}", n + 1
        out.append(label)
    return out


def _boto_lambda(spec: RewardSource, where: str) -> Any:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import NoRegionError
    except ImportError:
        raise ForgeError("a lambda: reward needs boto3 (pip install 'forge[aws]')") from None
    config = Config(connect_timeout=spec.timeout_s, read_timeout=spec.timeout_s,
                    retries={"total_max_attempts": spec.retries + 1, "mode": "standard"})
    try:
        return boto3.client("lambda", region_name=spec.region, config=config)
    except NoRegionError:
        raise RewardError(f"{where}: no AWS region: set the reward's `region` (or --region), or AWS_REGION") from None


def check_scores(scores: object, n: int, where: str) -> list[float]:
    """`n` finite scores as floats: Python or numpy numbers (not booleans), in a list, a tuple or a
    1-d numpy array; a RewardError saying what is wrong otherwise."""
    if type(scores).__module__ == "numpy" and getattr(scores, "ndim", None) == 1:
        scores = list(scores)  # type: ignore[call-overload]
    if not isinstance(scores, (list, tuple)):
        kind = getattr(scores, "type_name", type(scores).__name__)  # a worker's Opaque names the type it stands for
        raise RewardError(f"{where}: expected a list of {n} scores, got {kind}")
    if len(scores) != n:
        raise RewardError(f"{where}: returned {len(scores)} scores for {n} completions")
    out: list[float] = []
    for i, s in enumerate(scores):
        problem = number_problem(s)
        if problem:
            raise RewardError(f"{where}: score {i} {problem}")
        out.append(float(s))
    return out
