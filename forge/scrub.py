"""The one scrubber for text from user code or the environment that forge writes (errors, MLflow
tags, params and descriptions, the resolved recipe, the lineage, run.json and the lock, model cards,
the export manifest, the printed error line).

`scrub(text)` replaces, in this order:
- the value of every environment variable whose name says it holds a secret (a part KEY, SECRET,
  TOKEN, PASSWORD, CREDENTIAL(S), PRIVATE, AUTH, COOKIE, DSN, ... as in `AWS_SECRET_ACCESS_KEY`,
  `HF_TOKEN`, `DATABASE_URL`; not `TOKENIZERS_PARALLELISM`) and 8 to 65,536 characters long,
  by `<env:NAME>`;
- the password of a URL's user info: `scheme://user:***@host` (a password in the query, as
  `?password=...`, goes by the detectors);
- what forge's secret and PII detectors (`forge.data.pii.scan_pii`) find, by their placeholders
  (`<GITHUB_TOKEN>`, `<API_KEY>`, `<EMAIL>`, ...), except IP addresses (forge writes 127.0.0.1 URIs
  and versions) and phone numbers written as bare digits (forge writes ten-digit counts);
- the value after any key that names a secret, by `<SECRET>`: `token=hunter2`, `HF_TOKEN: ...`,
  `"clientSecret": "..."`, `--api-key ...`, `Authorization: Basic ...` (`pii_secrets.find_keyed`;
  `tokens=1234`, `tokens_per_s=12.5`, `pad_token=<pad>`, numbers, paths and templates stay).

`scrub_tree` (and `scrub_dict`, typed) does the same to every string of a JSON-like tree (dict
keys too), and replaces a string value whose key names a secret (`{"token": "..."}`) by
`<SECRET>`, leaving numbers and the shape alone. The same input always gives the same output, so a
scrubbed record compares equal to a freshly scrubbed one (run.json's recipe fingerprint on --resume).
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Any

from forge.data.pii import PII_TYPES, redact, scan_pii
from forge.data.pii_secrets import find_keyed, plain_value, secret_key

# name parts (split on "_") that say a variable holds a secret; and whole names that do
_SECRET_PART = re.compile(r"(?:API|ACCESS|SECRET|PRIVATE)?KEYS?|SECRETS?|TOKENS?|PASS(?:WORD|WD|PHRASE)?S?|PW|"
                          r"CREDENTIALS?|CREDS?|PRIVATE|AUTH|AUTHORIZATION|COOKIES?|SIGNATURE|DSN|SALT")
_SECRET_NAMES = frozenset({"DATABASE_URL", "DB_URL", "REDIS_URL", "MONGODB_URI", "SENTRY_DSN"})
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})
_MIN_VALUE, _MAX_VALUE = 8, 65_536
_TYPES = tuple(t for t in PII_TYPES if t != "ip_address")
# scheme://user:password@ (the password may hold anything but '@', '/' and whitespace)
_URL_AUTH = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<pw>[^\s@/]+)@")
SECRET = "<SECRET>"


@lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    upper = name.upper()
    if upper in _NOT_SECRET:
        return False
    return upper in _SECRET_NAMES or any(_SECRET_PART.fullmatch(p) for p in upper.split("_") if p)


def _env_secrets() -> list[tuple[str, str]]:
    """(value, name) of the secret-named variables now set, longest value first."""
    found = {v: k for k, v in os.environ.items() if secret_name(k) and _MIN_VALUE <= len(v) <= _MAX_VALUE}
    return sorted(found.items(), key=lambda item: -len(item[0]))


def mask_url_credentials(text: str) -> str:
    """`scheme://user:password@host` -> `scheme://user:***@host`, wherever it occurs in `text`."""
    return _URL_AUTH.sub(lambda m: f"{m['head']}***@", text) if "://" in text else text


def scrub(text: str) -> str:
    """`text` with environment secrets, URL passwords and the detectors' finds replaced."""
    if not text:
        return text
    for value, name in _env_secrets():
        if value in text:
            text = text.replace(value, f"<env:{name}>")
    text = mask_url_credentials(text)
    findings = [f for f in scan_pii(text, _TYPES)
                if not (f.type == "phone" and text[f.start:f.end].isdigit())]
    text = redact(text, findings) if findings else text
    # after the detectors, so `Authorization: Bearer <BEARER_TOKEN>` keeps the detector's placeholder
    return _replace(text, list(find_keyed(text)), SECRET)


def _replace(text: str, spans: list[tuple[int, int]], placeholder: str) -> str:
    """`text` with each of the (ordered, non-overlapping) spans replaced by `placeholder`."""
    if not spans:
        return text
    out, pos = [], 0
    for start, end in spans:
        out += [text[pos:start], placeholder]
        pos = end
    return "".join(out) + text[pos:]


def _scrub_value(key: Any, value: Any) -> Any:
    """A dict's value: a string under a key that names a secret is `<SECRET>` (unless it is a template,
    a path, a number, ...: `pii_secrets.plain_value`); anything else is scrubbed as a tree."""
    if isinstance(key, str) and isinstance(value, str) and secret_key(key) and not plain_value(value):
        return SECRET
    return scrub_tree(value)


def first_line(error: BaseException | str, limit: int = 300) -> str:
    """An error's first line for a message, scrubbed before it is cut: a secret cut in half at the
    limit would no longer match its detector."""
    lines = str(error).strip().splitlines()
    return scrub(lines[0] if lines else type(error).__name__)[:limit]


def scrub_tree(tree: Any) -> Any:
    """A copy of a JSON-like tree (dicts, lists, tuples, scalars) with every string scrubbed."""
    if isinstance(tree, str):
        return scrub(tree)
    if isinstance(tree, dict):
        return {scrub_tree(k): _scrub_value(k, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [scrub_tree(v) for v in tree]
    return tree


def scrub_dict(data: dict[str, Any]) -> dict[str, Any]:
    """`scrub_tree` of a dict, typed as one (keys and nested strings scrubbed)."""
    return {scrub(k): _scrub_value(k, v) for k, v in data.items()}
