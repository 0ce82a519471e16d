"""Detectors for service tokens and passwords (used by forge.data.pii): GitHub, Slack and
OpenAI/Stripe-style API keys by their documented prefixes, and passwords by the key that names
them (`password=`, `pwd:`, `"passwd": "..."`). Each takes the scan's text view (`.text`, `.lower`)
and yields `(start, end)` spans; look-alikes (`sk-learn`, `xoxb-your-token-here`, `password:
required`, `pwd: /home/ann`, `password=${VAR}`) stay.
"""
from __future__ import annotations

import re
from typing import Iterable

Spans = Iterable[tuple[int, int]]

# GitHub: classic ghp_/gho_/ghu_/ghs_/ghr_ + 36 base62; fine-grained github_pat_ + 82 (docs: "About
# authentication to GitHub", token formats).
_GITHUB = re.compile(r"g(?<![A-Za-z0-9_]g)(?:h[pousr]_[A-Za-z0-9]{36,251}|ithub_pat_[A-Za-z0-9_]{22,251})(?![A-Za-z0-9_])")
# Slack: xoxb- bot, xoxp- user, xoxa-/xoxr- app/refresh, xoxs- session; numeric team/user parts.
_SLACK = re.compile(r"x(?<![A-Za-z0-9]x)ox[bpars]-[0-9]{6,}-[A-Za-z0-9-]{8,}(?![A-Za-z0-9-])"
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


def find_api_key(v) -> Spans:
    if "sk-" in v.text or "sk_" in v.text:
        for m in _API_KEY.finditer(v.text):
            if _mixed(m.group()[3:]):
                yield m.span()


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
