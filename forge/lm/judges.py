"""LLM judges: a local Hugging Face folder or catalog phase (scored by its probabilities over the
score tokens: the expected score), an OpenAI-compatible chat endpoint or Bedrock InvokeModel (scores
parsed from the text), grading completions pointwise or a prompt's group in one call, with a verdict
cache in the run folder keyed by the judge, the rubric and the text."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from forge.errors import ForgeError
from forge.lm.judge_rubrics import JudgeError, Rubric, load_rubric, parse_group, parse_score, unreadable
from forge.recipe.judge import JUDGE_PREFIX, JudgeOptions
from forge.scrub import first_line, scrub

Fields = dict[str, list[Any]]


@dataclass(frozen=True)
class Reach:
    """How a remote judge is called: each request's timeout, retries after a failure, the AWS
    region, and a boto3 bedrock-runtime client to use (tests pass a stubbed one)."""

    timeout_s: float = 60.0
    retries: int = 2
    region: str | None = None
    client: Any = None


class TextJudge(Protocol):
    """A judge that answers in text (an endpoint, Bedrock)."""

    identity: str

    def ask(self, text: str) -> str: ...


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def _fingerprint(folder: Path) -> str:
    files = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" or p.name == "config.json")
    return ",".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


class LocalJudge:
    """A causal LM in this process: the prompt (in its chat template when it has one), then the
    next-token probabilities of the allowed scores ("1".."5", with or without a leading space),
    renormalised; the score is their expectation, so even a tiny judge gives a graded number."""

    def __init__(self, folder: Path, scale: tuple[int, int], label: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.folder, self.scale, self.label = folder, scale, label
        self.identity = f"local:{folder.resolve()}:{_fingerprint(folder)}"
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
            raise ForgeError(f"judge {label}: no tokenizer in the folder (none of {', '.join(_TOKENIZER_FILES)}); "
                             "a local judge reads its score tokens: copy the model's tokenizer files there")
        try:
            self.tok: Any = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as e:  # a damaged or unsupported tokenizer: transformers' own words
            raise ForgeError(f"judge {label}: its tokenizer cannot be loaded: {first_line(e)}") from None
        model: Any = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
        self.model: Any = model.to(self.device).eval()
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 4096)
        self.values = list(range(scale[0], scale[1] + 1))
        self.ids: list[list[int]] = []
        for v in self.values:
            ids = {x[0] for form in (str(v), f" {v}")
                   if len(x := self.tok(form, add_special_tokens=False)["input_ids"]) == 1}
            if not ids:
                raise ForgeError(f"judge {label}: its tokenizer has no single token for the score {v}; a local judge "
                                 "reads score-token probabilities, so choose a scale of one-token numbers (e.g. 1..5)")
            self.ids.append(sorted(ids))

    def _encode(self, text: str) -> list[int]:
        if getattr(self.tok, "chat_template", None):
            text = str(self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True))
        ids: list[int] = self.tok(text, add_special_tokens=not getattr(self.tok, "chat_template", None))["input_ids"]
        return ids

    @torch.no_grad()
    def _expected(self, ids: list[int]) -> tuple[float, int]:
        """(expected score, most likely score's token) after `ids` (the last `context - 1` tokens)."""
        x = torch.tensor([ids[-(self.context - 1):]], device=self.device)
        probs = torch.softmax(self.model(input_ids=x).logits[0, -1].float(), -1)
        p = torch.stack([probs[i].sum() for i in self.ids])
        p = p / p.sum().clamp(min=1e-30)
        best = int(p.argmax())
        return float(sum(v * float(q) for v, q in zip(self.values, p))), self.ids[best][0]

    def pointwise(self, text: str) -> list[float]:
        return [self._expected(self._encode(text))[0]]

    def group(self, text: str, n: int) -> list[float]:
        """All n responses in one context: after "Response i:" the score distribution is read, the
        most likely score written, and the next response's line begun."""
        ids, out = self._encode(text), []
        for i in range(n):
            ids = ids + self.tok(f"{'' if i == 0 else chr(10)}Response {i + 1}:", add_special_tokens=False)["input_ids"]
            score, token = self._expected(ids)
            out.append(score)
            ids = ids + [token]
        return out


class _Refuse(urllib.request.HTTPRedirectHandler):
    """No redirect is followed: urllib would resend the request, its API key with it, wherever the
    Location header points."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        raise JudgeError(f"judge {req.full_url}: HTTP {code} {msg}: a redirect to {scrub(newurl)}; forge does not "
                         "follow redirects for judges: set the judge to the URL that answers")


_NO_REDIRECTS = urllib.request.build_opener(_Refuse)


class ChatEndpoint:
    """An OpenAI-compatible chat API (vLLM's server, a Bedrock OpenAI-compatible endpoint):
    POST {base}/chat/completions, greedy, the reply's text."""

    def __init__(self, url: str, options: JudgeOptions, timeout_s: float, retries: int):
        base = url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else (
            f"{base}/chat/completions" if base.endswith("/v1") or "/v1/" in base else f"{base}/v1/chat/completions")
        self.options, self.timeout, self.retries = options, timeout_s, retries
        key = os.environ.get(options.api_key_env, "") if options.api_key_env else ""
        if options.api_key_env and not key:
            raise ForgeError(f"judge {url}: api_key_env {options.api_key_env!r} is not set in the environment")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.model = options.model or self._first_model()
        self.identity = f"openai:{self.url}:{self.model}"

    def _request(self, url: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            try:
                req = urllib.request.Request(url, data=data, headers=self.headers, method="GET" if data is None else "POST")
                with _NO_REDIRECTS.open(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except (urllib.error.URLError, OSError, ValueError) as e:
                code = getattr(e, "code", None)
                if attempt == self.retries or (code is not None and code < 500 and code != 429):
                    raise JudgeError(f"judge {self.url}: the request failed after {attempt + 1} attempt(s): {e}") from None
                time.sleep(min(2.0, 0.2 * 2 ** attempt))
        raise AssertionError("unreachable")

    def _first_model(self) -> str:
        listed = self._request(self.url.removesuffix("/chat/completions") + "/models", None)
        try:
            return str(listed["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise ForgeError(f"judge {self.url}: the endpoint lists no model; set judge.model") from None

    def ask(self, text: str) -> str:
        body = {"model": self.model, "messages": [{"role": "user", "content": text}], "temperature": 0,
                "max_tokens": self.options.max_tokens}
        answer = self._request(self.url, body)
        try:
            return str(answer["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"judge {self.url}: not an OpenAI chat completion: {str(answer)[:300]}") from None


class BedrockJudge:
    """Amazon Bedrock InvokeModel through boto3: the request body in the model family's form
    (Anthropic messages, Amazon Nova messages, else a prompt: Llama, Mistral, imported models)."""

    def __init__(self, model_id: str, options: JudgeOptions, client: Any):
        self.model_id, self.options, self.client = model_id, options, client
        self.identity = f"bedrock:{model_id}"

    def body(self, text: str) -> dict[str, Any]:
        mid, n = self.model_id.lower(), self.options.max_tokens
        if "anthropic." in mid:
            return {"anthropic_version": "bedrock-2023-05-31", "max_tokens": n, "temperature": 0,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
        if "nova" in mid:
            return {"messages": [{"role": "user", "content": [{"text": text}]}],
                    "inferenceConfig": {"maxTokens": n, "temperature": 0}}
        if "mistral." in mid:
            return {"prompt": f"<s>[INST] {text} [/INST]", "max_tokens": n, "temperature": 0}
        return {"prompt": text, "max_gen_len": n, "temperature": 0}

    def ask(self, text: str) -> str:
        try:
            resp = self.client.invoke_model(modelId=self.model_id, body=json.dumps(self.body(text)),
                                            contentType="application/json", accept="application/json")
            data = json.loads(resp["body"].read())
        except Exception as e:  # botocore's ClientError, connection errors, a body that is not JSON
            raise JudgeError(f"judge bedrock:{self.model_id}: InvokeModel failed: {type(e).__name__}: {e}") from None
        for path in (("content", 0, "text"), ("output", "message", "content", 0, "text"), ("generation",),
                     ("outputs", 0, "text"), ("choices", 0, "message", "content"), ("completion",)):
            value: Any = data
            try:
                for key in path:
                    value = value[key]
            except (KeyError, IndexError, TypeError):
                continue
            if isinstance(value, str):
                return value
        raise JudgeError(f"judge bedrock:{self.model_id}: no text in the answer {str(data)[:300]}")


def bedrock_client(model_id: str, region: str | None, timeout_s: float, retries: int) -> Any:
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import NoRegionError
    except ImportError:
        raise ForgeError("a bedrock: judge needs boto3 (pip install 'forge[aws]')") from None
    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                    retries={"total_max_attempts": retries + 1, "mode": "standard"})
    try:
        return boto3.client("bedrock-runtime", region_name=region, config=config)
    except NoRegionError:
        raise ForgeError(f"judge bedrock:{model_id}: no AWS region: set the judge's `region` (the reward source's "
                         "region:, or eval.llm_judge.region), or AWS_REGION") from None


class VerdictCache:
    """Verdicts in `folder`/judge_cache.sqlite: key (judge, rubric, scale, text) -> scores and answer."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(folder / "judge_cache.sqlite"), check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, scores TEXT, answer TEXT)")

    def get(self, key: str) -> list[float] | None:
        row = self.db.execute("SELECT scores FROM verdicts WHERE key = ?", (key,)).fetchone()
        return [float(x) for x in json.loads(row[0])] if row else None

    def put(self, key: str, scores: list[float], answer: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", (key, json.dumps(scores), answer))
        self.db.commit()

    def close(self) -> None:
        self.db.close()


def groups_of(prompts: list[str], fields: Fields) -> list[list[int]]:
    """Runs of consecutive completions of the same prompt (and fields): the groups of a rollout."""
    out: list[list[int]] = []
    for i, p in enumerate(prompts):
        same = out and prompts[out[-1][0]] == p and all(v[out[-1][0]] == v[i] for v in fields.values())
        if same:
            out[-1].append(i)
        else:
            out.append([i])
    return out


class Judge:
    """`score(prompts, completions, fields) -> list[float]` on the low..high scale; `hits` and
    `calls` count cached and asked verdicts."""

    def __init__(self, address: str, options: JudgeOptions, cache_dir: Path | None = None, reach: Reach = Reach()):
        self.address, self.options = address.removeprefix(JUDGE_PREFIX), options
        self.scale = (options.low, options.high)
        self.rubric: Rubric = load_rubric(options.rubric)
        self.backend: LocalJudge | TextJudge = local_or_remote(self.address, options, reach)
        self.cache = VerdictCache(cache_dir) if cache_dir is not None and options.cache else None
        self.hits = self.calls = 0

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    def _key(self, text: str, n: int) -> str:
        head = json.dumps([self.backend.identity, self.rubric.name, self.scale, self.options.scoring, n])
        return hashlib.sha256(f"{head}\0{text}".encode()).hexdigest()

    def _verdict(self, text: str, completions: list[str], first: int) -> tuple[list[float], str]:
        """The scores of one judge call, and the judge's raw answer ("" for a local judge)."""
        n, b = len(completions), self.backend
        if isinstance(b, LocalJudge):
            return (b.pointwise(text) if n == 1 else b.group(text, n)), ""
        answer = b.ask(text)
        scores = [parse_score(answer, self.scale)] if n == 1 else parse_group(answer, n, self.scale)
        if any(s is None for s in scores):
            raise unreadable(self.label, completions, scores, first, answer, self.scale)
        return [float(s) for s in scores if s is not None], answer

    @property
    def label(self) -> str:
        return self.address if len(self.address) < 80 else self.address[:77] + "..."

    def score(self, prompts: list[str], completions: list[str], fields: Fields) -> list[float]:
        units = groups_of(prompts, fields) if self.options.scoring == "group" else [[i] for i in range(len(completions))]
        out = [0.0] * len(completions)
        for unit in units:
            texts = [completions[i] for i in unit]
            row = {k: v[unit[0]] for k, v in fields.items()}
            text = self.rubric.render(prompts[unit[0]], texts, row, self.scale)
            key = self._key(text, len(unit))
            scores = self.cache.get(key) if self.cache is not None else None
            if scores is not None and len(scores) == len(unit):
                self.hits += 1
            else:
                scores, answer = self._verdict(text, texts, unit[0])
                self.calls += 1
                if self.cache is not None:
                    self.cache.put(key, scores, answer)
            for i, s in zip(unit, scores):
                out[i] = s
        return out


def local_or_remote(address: str, options: JudgeOptions, reach: Reach = Reach()) -> LocalJudge | TextJudge:
    """The backend an address names: http(s):// endpoint, bedrock:ID, catalog://, or a folder."""
    scale = (options.low, options.high)
    if address.startswith(("http://", "https://")):
        return ChatEndpoint(address, options, reach.timeout_s, reach.retries)
    if address.startswith("bedrock:"):
        model_id = address.removeprefix("bedrock:")
        client = reach.client or bedrock_client(model_id, reach.region, reach.timeout_s, reach.retries)
        return BedrockJudge(model_id, options, client)
    if address.startswith("catalog://"):
        from forge.catalog import checkpoint

        return LocalJudge(checkpoint(address), scale, address)
    folder = Path(address)
    if not (folder / "config.json").is_file():
        raise ForgeError(f"judge {address!r}: not a Hugging Face model folder (no config.json)")
    return LocalJudge(folder, scale, address)
