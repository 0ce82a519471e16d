"""Detectors for service tokens and passwords (used by forge.data.pii): GitHub, Slack and the API
keys of other services by their documented prefixes (OpenAI, Anthropic, Hugging Face, GitLab, npm,
PyPI, Stripe, SendGrid, Discord, Telegram, Twilio, Mailchimp, Square, Google, Artifactory), and
passwords by the key that names them (`password=`, `pwd:`, `"passwd": "..."`). Each takes the
scan's text view (`.text`, `.lower`) and yields `(start, end)` spans; look-alikes (`sk-learn`,
`xoxb-your-token-here`, `password: required`, `pwd: /home/ann`, `password=${VAR}`) stay.

`find_keyed` (forge.scrub's, not the data scan's: training text says "token: 12" and "the secret:
..." in earnest) finds the value after any key that names a secret (`token=`, `HF_TOKEN: `,
`"clientSecret": "..."`, `--api-key ...`, `Authorization: Basic ...`).
"""
from __future__ import annotations

import re
from typing import Iterable

Spans = Iterable[tuple[int, int]]

# GitHub: classic ghp_/gho_/ghu_/ghs_/ghr_ + 36 base62; fine-grained github_pat_ + 82 (docs: "About
# authentication to GitHub", token formats).
_GITHUB = re.compile(r"g(?<![A-Za-z0-9_]g)(?:h[pousr]_[A-Za-z0-9]{36,251}|ithub_pat_[A-Za-z0-9_]{22,251})(?![A-Za-z0-9_])")
# Slack: xoxb- bot, xoxp- user, xoxa-/xoxr- app/refresh, xoxs- session, xoxo-; numeric team/user parts.
_SLACK = re.compile(r"x(?<![A-Za-z0-9]x)ox[bparso]-[0-9]{6,}-[A-Za-z0-9-]{8,}(?![A-Za-z0-9-])"
                    r"|h(?<![\w.]h)ooks\.slack\.com/services/T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/[A-Za-z0-9]{16,}")
# OpenAI (sk-, sk-proj-), Anthropic (sk-ant-), Stripe secret keys (sk_live_/sk_test_).
_API_KEY = re.compile(r"s(?<![\w-]s)k(?:-(?:proj-|ant-(?:api[0-9]{2}-)?|svcacct-)?[A-Za-z0-9_-]{20,}"
                      r"|_(?:live|test)_[A-Za-z0-9]{16,})(?![\w-])")


def _mixed(token: str) -> bool:
    """Random-looking: has a digit and a letter (so a hyphenated word like sk-abcdef... stays)."""
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token)


def find_github(v) -> Spans:
    if "_" in v.text and any(p in v.text for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")):
        yield from (m.span() for m in _GITHUB.finditer(v.text))


def find_slack(v) -> Spans:
    if "xox" in v.text or "hooks.slack" in v.text:
        yield from (m.span() for m in _SLACK.finditer(v.text))


# Other services' keys, by a prefix no word has: (a substring the text must hold, the prefix as a
# pattern that starts with a letter, the random body), from the vendors' docs and detect-secrets'
# plugins. The body must mix two of lower case, upper case and digits.
_PREFIXED = (
    ("hf_", "hf_", "[A-Za-z0-9]{30,}"), ("api_org_", "api_org_", "[A-Za-z0-9]{30,}"),  # Hugging Face user / org
    ("gl", "gl(?:pat|dt|ptt|rt|soat|cbt|oas|ft|imt|agent)-", "[A-Za-z0-9_-]{20,}"),   # GitLab
    ("GR1348941", "GR1348941", "[A-Za-z0-9_-]{20,}"),                                  # GitLab runner registration
    ("npm_", "npm_", "[A-Za-z0-9]{36}"),                                               # npm
    ("pypi-", "pypi-AgE", "[A-Za-z0-9_-]{50,}"),                                       # PyPI (a macaroon)
    ("rk_", "rk_(?:live|test)_", "[A-Za-z0-9]{16,}"),                                  # Stripe restricted keys
    ("whsec_", "whsec_", "[A-Za-z0-9]{24,}"),                                          # Stripe webhook secrets
    ("SG.", r"SG\.", r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),                         # SendGrid
    ("xapp-", "xapp-", "[0-9]+-[A-Za-z0-9-]{20,}"),                                    # Slack app-level tokens
    ("SK", "SK", "[0-9a-f]{32}"), ("AC", "AC", "[0-9a-f]{32}"),                        # Twilio API key, account SID
    ("sq0", "sq0(?:atp|csp)-", "[A-Za-z0-9_-]{22,}"), ("EAAA", "EAAA", "[A-Za-z0-9_-]{60}"),  # Square
    ("AIza", "AIza", "[A-Za-z0-9_-]{35}"),                                             # Google API keys
    ("AKCp", "AKCp", "[0-9][A-Za-z0-9]{60,}"),                                         # Artifactory API keys
    ("-us", "[0-9a-f]", "[0-9a-f]{31}-us[0-9]{1,2}"),                                  # Mailchimp
)


def _service(head: str, body: str) -> re.Pattern[str]:
    """The first character (or class), then a look-behind saying no word character came before it
    (a leading character lets `re` scan fast), the rest; nothing of the key's alphabet may follow."""
    first = head[:head.index("]") + 1] if head.startswith("[") else head[0]
    return re.compile(f"{first}(?<![\\w-]{first}){head[len(first):]}(?P<b>{body})(?![\\w-])")


_SERVICES = tuple((gate, _service(head, body)) for gate, head, body in _PREFIXED)
# Discord bot tokens: [MNO] + 23-25, '.', 6, '.', 27+ (base64url); Telegram bot tokens: 8-10 digits,
# ':', 35. Each pattern starts at its separator (a literal scans fast); the part before is checked after.
_DISCORD = re.compile(r"\.(?<=[A-Za-z0-9_-]{24}\.)[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,}(?![\w-])")
_TELEGRAM = re.compile(r":(?<=[0-9]{8}:)[A-Za-z0-9_-]{35}(?![\w-])")


def _classes(body: str) -> int:
    """How many of lower case, upper case and digits `body` has (a key mixes them; a word or number does not)."""
    return sum((any(c.islower() for c in body), any(c.isupper() for c in body), any(c.isdigit() for c in body)))


def _head(text: str, end: int, alphabet: str) -> int:
    """Where the run of `alphabet` characters that ends at `end` starts."""
    start = end
    while start > 0 and text[start - 1] in alphabet:
        start -= 1
    return start


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


def _bot_tokens(text: str) -> Spans:
    """Discord and Telegram bot tokens (all three of lower case, upper case and digits: a dotted
    name or a time stamp does not pass)."""
    if "." in text:
        for m in _DISCORD.finditer(text):
            start = _head(text, m.start(), _B64URL)
            if 24 <= m.start() - start <= 26 and text[start] in "MNO" and not (start and text[start - 1].isalnum()):
                if _classes(text[start:m.end()]) == 3:
                    yield start, m.end()
    if ":" in text:
        for m in _TELEGRAM.finditer(text):
            start = _head(text, m.start(), "0123456789")
            if 8 <= m.start() - start <= 10 and not (start and (text[start - 1].isalnum() or text[start - 1] in "_:-")):
                if _classes(m.group()) == 3:
                    yield start, m.end()


def find_api_key(v) -> Spans:
    if "sk-" in v.text or "sk_" in v.text:
        for m in _API_KEY.finditer(v.text):
            if _mixed(m.group()[3:]):
                yield m.span()
    for gate, pattern in _SERVICES:
        if gate in v.text:
            for m in pattern.finditer(v.text):
                if _classes(m["b"]) >= 2:
                    yield m.span()
    yield from _bot_tokens(v.text)


# The key, an optional closing quote (JSON, YAML), then `=` or `:`; the value quoted or bare.
_PASSWORD = re.compile(
    r"(?i)p(?<![a-z]p)(?:ass(?:word|wd|phrase)|wd)[\"']?\s*(?P<sep>=|:)\s*"
    r"(?:\"(?P<dq>[^\"\n]{1,200})\"|'(?P<sq>[^'\n]{1,200})'|(?P<bare>[^\s\"',;]{1,200}))"
)
_PLACEHOLDER = re.compile(r"^(?:<[^>]*>|\$\{?[A-Za-z_][\w]*\}?|%\(\w+\)s|\{\{.*\}\}|\{\w*\}|(.)\1*)$")


def find_password(v) -> Spans:
    if not any(k in v.lower for k in ("password", "passwd", "passphrase", "pwd")):
        return
    text, pos = v.text, 0
    while (m := _PASSWORD.search(text, pos)) is not None:
        group = next(g for g in ("dq", "sq", "bare") if m.group(g) is not None)
        value, pos = m.group(group), m.end()
        if _PASSWORD.match(value):  # "password: password=x": the inner key names the value
            pos = m.start(group)
            continue
        if _PLACEHOLDER.match(value) or value.startswith(("/", "~")):  # templates, masks, paths (pwd)
            continue
        # Prose uses "password: must be ...": a bare value after ':' counts only if it looks made up
        # (a digit, a symbol, or a capital past the first letter); config style `key=value` always counts.
        if group == "bare" and m.group("sep") == ":" and not (
                any(not c.isalpha() for c in value) or any(c.isupper() for c in value[1:])):
            continue
        yield m.span(group)


# ---------------------------------------------------------------- values after a key naming a secret
# A key (a word with `_ . -` inside; after `--` on a command line), an optional closing quote (JSON,
# a Python dict, escaped JSON), then `=` or `:` or, after `--key`, spaces; then the value: quoted,
# quoted in escaped JSON, or bare up to a space, a quote, `, ; &` or a bracket.
_KEYED = re.compile(
    r"(?<![\w.-])(?P<dash>--)?(?P<key>[A-Za-z][A-Za-z0-9_.-]{0,80})\\?[\"']?"
    r"(?:[ \t]*(?P<sep>[=:])[ \t]*|(?(dash)[ \t]+|(?!)))"
    r"(?:\"(?P<dq>[^\"\n]{1,400})\"|'(?P<sq>[^'\n]{1,400})'|\\\"(?P<eq>[^\"\\\n]{1,400})\\\""
    r"|(?P<bare>[^\s\"'\\,;&<>(){}\[\]]{1,400}))"
)
_KEY_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # snake, kebab, dotted and camelCase parts
# a key whose last part is one of these names a secret ("tokens", "tokenizer" and "secret_name" do not)
_SECRET_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwd", "passphrase", "pwd", "credential", "credentials", "creds",
    "signature", "apikey", "accesskey", "secretkey", "privatekey", "authtoken", "accesstoken", "apitoken",
    "refreshtoken", "sessiontoken", "clientsecret", "authorization"})
# "..._key" names a secret after one of these ("sort_key", "cache_key" and "key" alone do not)
_KEY_QUALIFIERS = frozenset({
    "api", "access", "secret", "private", "priv", "auth", "client", "service", "account", "master", "signing",
    "encryption", "db", "database", "app", "consumer", "license", "subscription", "session", "storage", "shared",
    "webhook", "deploy", "ssh", "hmac", "sas", "iam"})
# "..._token" of a tokenizer (its special tokens: pad_token=<pad>, eos_token: </s>) is not a secret
_TOKENIZER_WORDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end", "stop",
                              "image", "video", "audio", "vision", "additional", "eot", "fim", "think"})
_NOT_VALUES = frozenset({"true", "false", "none", "null", "nil", "yes", "no", "on", "off", "undefined", "required",
                         "optional", "redacted", "hidden", "masked", "unset", "empty"})
_AUTH_SCHEMES = frozenset({"basic", "bearer", "token", "digest", "negotiate", "ntlm", "apikey", "aws4-hmac-sha256"})
_CREDENTIAL = re.compile(r"[ \t]+(?P<cred>[^\s\"',;]{1,400})")
_GOES_ON = re.compile(r"[ \t]+[A-Za-z]")  # another word after a value, on its line
_GATE = re.compile(r"(?i)token|secret|pass|pwd|key|cred|signature|authorization")


def secret_key(key: str) -> bool:
    """Whether a key (`HF_TOKEN`, `aws_secret_access_key`, `clientSecret`, `x-api-key`) names a secret."""
    parts = [p.lower() for p in _KEY_PARTS.findall(key)]
    if not parts:
        return False
    last = parts[-1]
    if last == "token" and any(p in _TOKENIZER_WORDS for p in parts[:-1]):
        return False
    if last in _SECRET_WORDS:
        return True
    if last == "pass":  # db_pass, smtp_pass; not "pass" alone (pass@1, a test's result)
        return len(parts) > 1
    return last == "key" and len(parts) > 1 and parts[-2] in _KEY_QUALIFIERS


def plain_value(value: str, prose: bool = False) -> bool:
    """A value that is no secret although its key names one: empty, a template or mask, a path, a
    short number, a word like `true`; with `prose` (`key: value` unquoted), also a lower-case word
    ("the secret: nobody knows")."""
    if not value or _PLACEHOLDER.match(value) or value.lower() in _NOT_VALUES:
        return True
    if value.startswith(("/", "~", "./", "../")):  # a path: credentials: ~/.aws/credentials
        return True
    if len(value) < 8 and re.fullmatch(r"[+-]?[0-9]+(?:\.[0-9]+)?", value):
        return True
    return prose and value.isalpha() and not any(c.isupper() for c in value[1:])


def find_keyed(text: str) -> Spans:
    """Spans of the values after keys that name a secret (`token=hunter2`, `"api_key": "..."`,
    `--hf-token hf_...`, `Authorization: Basic dXNl...`)."""
    if not _GATE.search(text):
        return
    pos = 0
    while (m := _KEYED.search(text, pos)) is not None:
        group = next(g for g in ("dq", "sq", "eq", "bare") if m.group(g) is not None)
        value, pos = m.group(group), m.end()
        if not secret_key(m["key"]):
            pos = m.start(group)  # "note: token=hunter2": a key may start inside another's value
            continue
        if m["key"].lower().endswith("authorization") and value.lower() in _AUTH_SCHEMES:
            cred = _CREDENTIAL.match(text, m.end())  # `Authorization: Basic <credential>`
            if cred is not None and not plain_value(cred["cred"]):
                yield cred.span("cred")
            continue
        # `key: word` is prose only where the sentence goes on ("the secret: nobody knows"); a word
        # ending its line or the text is a value (`password: letmein`, YAML's form)
        prose = group == "bare" and m["sep"] == ":" and _GOES_ON.match(text, m.end()) is not None
        if not plain_value(value, prose=prose):
            yield m.span(group)
