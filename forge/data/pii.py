"""Find secrets and personal data in text, and replace them with typed placeholders.

`scan_pii` returns `Finding(type, start, end)` spans and never keeps the matched value;
`redact` turns spans into placeholders such as `<EMAIL>`. Each detector is a regular
expression plus, where the format has one, a checksum or range rule (Luhn for cards,
mod-97 for IBANs, the SSA rules for SSNs, octet ranges for IPv4, a decodable header for
JWTs) so that look-alikes (order numbers, dates, version strings, git SHAs) stay.

Text is scanned after folding full-width forms to ASCII and dropping zero-width characters
(`pii_checks.fold`), so `ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ` and an email split by U+200B are found; spans
refer to the original text. Service tokens and passwords are in `pii_secrets`.

Not covered: names and postal addresses (they need an NER model), phone numbers outside North
America unless written with `+` or after a word like "phone"/"tel", AWS secret keys without "aws"
or "secret" in the 100 characters before them or a key id (AKIA..., ASIA...) within 100 characters
on either side, lower-case IBANs written without groups of four
and without the word "IBAN" nearby.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from forge.data.pii_checks import IBAN_LENGTHS, card_ok, fold, iban_ok, ssn_ok
from forge.data.pii_secrets import find_api_key, find_github, find_password, find_slack

# Detection priority: where two findings overlap, the earlier type in this tuple wins.
PII_TYPES: tuple[str, ...] = (
    "private_key", "jwt", "bearer_token", "aws_access_key", "aws_secret_key",
    "github_token", "slack_token", "api_key", "password", "email", "iban", "credit_card", "ssn", "ip_address", "phone",
)
_RANK = {t: i for i, t in enumerate(PII_TYPES)}


@dataclass(frozen=True, slots=True)
class Finding:
    """One detected span of `text[start:end]`; the value itself is deliberately not stored."""

    type: str
    start: int
    end: int

    @property
    def placeholder(self) -> str:
        return placeholder(self.type)


def placeholder(pii_type: str) -> str:
    """`"credit_card"` -> `"<CREDIT_CARD>"`."""
    return f"<{pii_type.upper()}>"


def _jwt_header_ok(token: str) -> bool:
    head = token.split(".", 1)[0]
    try:
        obj = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and ("alg" in obj or "typ" in obj)


# ---------------------------------------------------------------- detectors
# Python's `re` scans fastest when a pattern starts with a character class, so boundary
# look-behinds sit after the first character (`[0-9](?<![\w-][0-9])` = a digit not preceded
# by a word character or '-'), and each detector is gated by a cheap test of the text.


class _View:
    """A text plus lazily computed facts that the detectors' gates share."""

    __slots__ = ("text", "_lower", "_d3")

    def __init__(self, text: str):
        self.text, self._lower, self._d3 = text, None, None

    @property
    def lower(self) -> str:
        if self._lower is None:
            self._lower = self.text.lower()
        return self._lower

    @property
    def d3(self) -> bool:  # three consecutive digits: needed by phone, card and SSN formats
        if self._d3 is None:
            self._d3 = _D3.search(self.text) is not None
        return self._d3


_D3 = re.compile(r"[0-9][0-9][0-9]")
Spans = Iterable[tuple[int, int]]

_EMAIL = re.compile(  # \w is Unicode: internationalised local parts and domains (RFC 6531)
    r"\w(?<![\w.%+-]\w)[\w.%+-]*@"
    r"(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+([^\W\d_]{2,24}|xn--[a-z0-9-]{2,59})(?![\w-])"
)
_NOT_TLD = {"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "pdf"}  # icon@2x.png


def _find_email(v: _View) -> Spans:
    if "@" in v.text:
        for m in _EMAIL.finditer(v.text):
            if m[1].lower() not in _NOT_TLD:
                yield m.span()


_PHONE_WORDS = re.compile(r"tel|fax|call|sms|phone|mobile|whatsapp")  # gate, on the lower-cased text
_CONTEXT_PHONE = re.compile(
    r"(?i)(?:\b(?:tel|fax|call|sms)|phone|mobile|whatsapp)(?:\s*(?:number|no|nr|#))?\W{0,6}(?:(?:at|on)\W{1,3})?$"
)
_DATE = re.compile(r"[0-9]{4}[/.-][0-9]{1,2}[/.-][0-9]{1,2}|[0-9]{1,2}[/.-][0-9]{1,2}[/.-][0-9]{2,4}")
# North American: (555) 123-4567, 555-123-4567, 555.123.4567, +1 555 123 4567, 1-800-555-0199.
_AREA = r"(?:\([2-9][0-9]{2}\)\s?|[2-9][0-9]{2}[ .-])"
_PHONE_NANP = re.compile(  # the first character is consumed, then a look-behind says which it was
    r"[+(1-9](?<![\w+.-][+(1-9])"
    rf"(?:(?<=\+)1[ .-]?{_AREA}|(?<=1)[ .-]?{_AREA}|(?<=\()[2-9][0-9]{{2}}\)\s?|(?<=[2-9])[0-9]{{2}}[ .-])"
    r"[0-9]{3}[ .-][0-9]{4}(?![\w-]|\.[0-9])"
)
_PHONE_INTL = re.compile(r"\+(?<![\w+]\+)[0-9]{1,3}(?:[ .-]?\(?[0-9]{1,4}\)?){2,6}(?![\w-]|\.[0-9])")
_PHONE_BARE = re.compile(r"[(0-9](?<![\w+.-][(0-9])[0-9 ().-]{5,18}[0-9](?![\w-]|\.[0-9])")  # + context
# Ten bare digits shaped like a North American number (area and exchange start 2-9), unless a
# word before them says it is an order, invoice, id, ... number.
_PHONE_TEN = re.compile(r"[2-9](?<![\w+.$#/-][2-9])[0-9]{2}[2-9][0-9]{6}(?![\w-]|[.,][0-9]|/)")
_NOT_PHONE = re.compile(r"(?i)(?:order|invoice|ticket|ref|id|serial|account|acct|isbn|tracking|sku|po|"
                        r"case|epoch|timestamp|no|nr|#)\W{0,4}$")


def _find_phone(v: _View) -> Spans:
    text = v.text
    if v.d3:
        for m in _PHONE_NANP.finditer(text):
            yield m.span()
    if "+" in text:
        for m in _PHONE_INTL.finditer(text):
            if 8 <= sum(c.isdigit() for c in m.group()) <= 15 and not _DATE.fullmatch(m.group()[1:]):
                yield m.span()
    if v.d3:
        for m in _PHONE_TEN.finditer(text):
            if not _NOT_PHONE.search(text, max(0, m.start() - 16), m.start()):
                yield m.span()
    if _PHONE_WORDS.search(v.lower):
        for m in _PHONE_BARE.finditer(text):
            if (not _DATE.fullmatch(m.group()) and 7 <= sum(c.isdigit() for c in m.group()) <= 15
                    and _CONTEXT_PHONE.search(text, max(0, m.start() - 24), m.start())):
                yield m.span()


_CARD_CAND = re.compile(
    r"[0-9](?<![\w.-][0-9])(?:[0-9]{12,18}"
    r"|[0-9]{3}([ -])[0-9]{4}\1[0-9]{4}\1[0-9]{4}(?:\1[0-9]{3})?"  # 4-4-4-4(-3)
    r"|[0-9]{3}([ -])[0-9]{6}\2[0-9]{4,5})"                        # Amex 4-6-5, Diners 4-6-4
    r"(?![\w]|-[0-9]|\.[0-9])"
)


def _find_card(v: _View) -> Spans:
    if v.d3:
        for m in _CARD_CAND.finditer(v.text):
            if card_ok(m.group().replace(" ", "").replace("-", "")):
                yield m.span()


_IBAN_CAND = re.compile(r"[A-Z](?<![A-Za-z0-9][A-Z])[A-Z][0-9]{2}(?: ?[A-Z0-9]){11,30}")
_IBAN_LOWER = re.compile(r"[a-z](?<![A-Za-z0-9][a-z])[a-z][0-9]{2}(?: ?[a-z0-9]){11,30}")
# Lower case without the word IBAN nearby: only when grouped in fours. The match starts at the
# second check digit (a digit class scans fast); the country code is found by look-behind.
_IBAN_GROUPED = re.compile(r"[0-9](?= [a-z0-9]{4} )(?<=[a-z]{2}[0-9]{2})(?<![A-Za-z0-9][a-z]{2}[0-9]{2})(?: [a-z0-9]{4}){2,7}"
                           r"(?: [a-z0-9]{1,3})?(?![A-Za-z0-9])")


def _find_iban(v: _View) -> Spans:
    text = v.text
    yield from _ibans(text, (m.span() for m in _IBAN_CAND.finditer(text)))
    if "iban" in v.lower:
        near = [m.start() for m in re.finditer("iban", v.lower)]
        yield from (s for s in _ibans(text, (m.span() for m in _IBAN_LOWER.finditer(text)))
                    if any(s[0] - 40 <= i <= s[1] + 40 for i in near))
    if v.d3:
        yield from _ibans(text, ((m.start() - 3, m.end()) for m in _IBAN_GROUPED.finditer(text)))


def _ibans(text: str, candidates: Iterable[tuple[int, int]]) -> Spans:
    for start, stop in candidates:
        want = IBAN_LENGTHS.get(text[start:start + 2].upper())
        if want is None:
            continue
        # Take exactly `want` alphanumerics (spaces allowed between), then check what follows.
        n, end = 0, start
        while end < stop and n < want:
            n += text[end] != " "
            end += 1
        if n == want and (end >= len(text) or not text[end].isalnum()):
            if iban_ok(text[start:end].replace(" ", "").upper()):
                yield start, end


_SSN = re.compile(r"[0-9](?<![\w-][0-9])([0-9]{2})([- ])([0-9]{2})\2([0-9]{4})(?![\w-])")
_SSN_BARE = re.compile(r"[0-9](?<![\w-][0-9])([0-9]{2})([0-9]{2})([0-9]{4})(?![\w-])")
_CONTEXT_SSN = re.compile(r"(?i)(?:\bssn|social security(?:\s*(?:number|no|#))?)\W{0,6}(?:is\W{1,3})?$")


def _find_ssn(v: _View) -> Spans:
    if not v.d3:
        return
    text = v.text
    for m in _SSN.finditer(text):
        if ssn_ok(text[m.start():m.start() + 3], m[3], m[4]):
            yield m.span()
    if "ssn" in v.lower or "social security" in v.lower:
        for m in _SSN_BARE.finditer(text):
            if ssn_ok(text[m.start():m.start() + 3], m[2], m[3]) and _CONTEXT_SSN.search(
                    text, max(0, m.start() - 30), m.start()):
                yield m.span()


# IAM key-ID prefixes: AKIA long-term, ASIA temporary (STS), ABIA/ACCA service, A3T legacy.
_AWS_KEY = re.compile(r"A(?<![A-Za-z0-9]A)(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])")
# 40 characters that start a run of base64 (`=` may come before them: `aws_secret_access_key=...`)
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+](?<![A-Za-z0-9/+][A-Za-z0-9/+])[A-Za-z0-9/+]{39}(?![A-Za-z0-9/+=])")
_CONTEXT_AWS = re.compile(r"(?i)aws|secret")
_HEX40 = re.compile(r"[0-9a-fA-F]{40}")


def _find_aws_key(v: _View) -> Spans:
    return (m.span() for m in _AWS_KEY.finditer(v.text))


def _find_aws_secret(v: _View) -> Spans:
    ids = [m.start() for m in _AWS_KEY.finditer(v.text)]  # a secret beside its key id needs no word
    if "aws" not in v.lower and "secret" not in v.lower and not ids:
        return
    for m in _AWS_SECRET.finditer(v.text):
        s = m.group()
        if _HEX40.fullmatch(s) or s.lower() == s or s.upper() == s:  # git SHA, hashes, words
            continue
        if _CONTEXT_AWS.search(v.text, max(0, m.start() - 100), m.start()) or any(
                m.start() - 100 <= i <= m.end() + 100 for i in ids):
            yield m.span()


# PEM (five dashes) and SSH2 (four, with spaces: `---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----`)
_PEM_BEGIN = re.compile(r"-{4,5} ?BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)? ?-{4,5}")
_PEM_END = re.compile(r"-{4,5} ?END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)? ?-{4,5}")
# A block with no END (a truncated record): the base64 and header lines that follow BEGIN,
# split by newlines, JSON-escaped newlines or spaces (a key flattened onto one line).
_PEM_TAIL = re.compile(r"(?:(?:\r?\n|\\n| )+(?:[A-Za-z0-9+/=]{16,}|(?:Proc-Type|DEK-Info|Comment):[^\n]*))*")


def _find_private_key(v: _View) -> Spans:
    """BEGIN ... END blocks, matched by position lists so junk with many BEGINs stays linear."""
    text = v.text
    if "PRIVATE KEY" not in text:
        return
    begins = [m.span() for m in _PEM_BEGIN.finditer(text)]
    ends = [m.end() for m in _PEM_END.finditer(text)]
    done = 0
    for i, (start, head_end) in enumerate(begins):
        if start < done:
            continue
        limit = begins[i + 1][0] if i + 1 < len(begins) else len(text)
        j = bisect.bisect_right(ends, head_end)
        done = ends[j] if j < len(ends) and ends[j] <= limit else _PEM_TAIL.match(text, head_end).end()
        yield start, done


_JWT = re.compile(r"e(?<![\w-]e)yJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*(?![\w-])")


def _find_jwt(v: _View) -> Spans:
    if "eyJ" in v.text:
        for m in _JWT.finditer(v.text):
            if _jwt_header_ok(m.group()):
                yield m.span()


_BEARER = re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{16,}=*)(?![\w.~+/-])")


def _find_bearer(v: _View) -> Spans:
    if "bearer" in v.lower:
        for m in _BEARER.finditer(v.text):
            if any(c.isdigit() or c in "._~+/-" for c in m[1]):  # "bearer instruments" stays
                yield m.span(1)


_IPV4 = re.compile(r"[0-9](?<![\w.][0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?![\w]|\.\w)")
_VERSION_CONTEXT = re.compile(r"(?i)(?:\b(?:v|version|ver\.?|release|build|rev)|==|>=|<=|~=)\s*[:#]?\s*$")
_IPV6 = re.compile(  # a loose candidate; ipaddress.IPv6Address decides
    r"[0-9A-Fa-f:](?<![\w:.][0-9A-Fa-f:])[0-9A-Fa-f:]{1,38}(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3})?(?![\w:]|\.[0-9])"
)


def _octets_ok(s: str) -> bool:
    return all(int(o) <= 255 and (o == "0" or o[0] != "0") for o in s.split("."))


def _find_ip(v: _View) -> Spans:
    text = v.text
    for m in _IPV4.finditer(text):
        if _octets_ok(m.group()) and not _VERSION_CONTEXT.search(text, max(0, m.start() - 12), m.start()):
            yield m.span()
    if "::" in text or text.count(":") >= 7:
        for m in _IPV6.finditer(text):
            s = m.group()
            if s.count(":") >= 2 and any(c.isdigit() for c in s):
                try:
                    ipaddress.IPv6Address(s)
                except ValueError:
                    continue
                yield m.span()


_DETECTORS: dict[str, Callable[[_View], Spans]] = {
    "private_key": _find_private_key,
    "jwt": _find_jwt,
    "bearer_token": _find_bearer,
    "aws_access_key": _find_aws_key,
    "aws_secret_key": _find_aws_secret,
    "github_token": find_github,
    "slack_token": find_slack,
    "api_key": find_api_key,
    "password": find_password,
    "email": _find_email,
    "iban": _find_iban,
    "credit_card": _find_card,
    "ssn": _find_ssn,
    "ip_address": _find_ip,
    "phone": _find_phone,
}
assert tuple(_DETECTORS) == PII_TYPES


def check_types(types: Iterable[str] | None) -> tuple[str, ...]:
    """Validate a list of type names (None = all); raise ValueError naming the unknown ones."""
    if types is None or types is PII_TYPES:
        return PII_TYPES
    types = tuple(types)
    if types in _CHECKED:
        return _CHECKED[types]
    unknown = [t for t in types if t not in _RANK]
    if unknown:
        raise ValueError(f"unknown PII type(s) {unknown}; known: {list(PII_TYPES)}")
    _CHECKED[types] = out = tuple(sorted(set(types), key=_RANK.__getitem__))
    return out


_CHECKED: dict[tuple[str, ...], tuple[str, ...]] = {}


def scan_pii(text: str, types: Sequence[str] | None = None) -> list[Finding]:
    """All non-overlapping findings in `text`, sorted by position.

    Where spans of different types overlap, the higher-priority type (earlier in
    `PII_TYPES`: secrets before personal data) is kept; overlapping spans of one type merge.
    """
    folded, keep = fold(text)
    view = _View(folded)
    cands = [Finding(t, s, e) for t in check_types(types) for s, e in _DETECTORS[t](view) if e > s]
    if keep is not None:  # characters were dropped: map spans back onto the original text
        cands = [Finding(f.type, keep[f.start], keep[f.end - 1] + 1) for f in cands]
    if not cands:
        return []
    cands.sort(key=lambda f: (_RANK[f.type], f.start - f.end, f.start))
    kept: list[Finding] = []
    for f in cands:
        clash = [k for k in kept if f.start < k.end and k.start < f.end]
        if not clash:
            kept.append(f)
        elif all(k.type == f.type for k in clash):  # merge same-type overlaps
            for k in clash:
                kept.remove(k)
            kept.append(Finding(f.type, min(f.start, *(k.start for k in clash)),
                                max(f.end, *(k.end for k in clash))))
    kept.sort(key=lambda f: f.start)
    return kept


def redact(text: str, findings: Iterable[Finding]) -> str:
    """Replace each (non-overlapping, as `scan_pii` returns) finding with its placeholder."""
    out, pos = [], 0
    for f in sorted(findings, key=lambda f: f.start):
        if f.start < pos:
            continue
        out.append(text[pos:f.start])
        out.append(f.placeholder)
        pos = f.end
    out.append(text[pos:])
    return "".join(out)
