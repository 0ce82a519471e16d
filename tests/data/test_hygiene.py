"""Hygiene end to end: redact/drop/fail/off, counts, no value ever leaks, lazy streaming."""
from __future__ import annotations

import itertools
import logging
import pickle

import pytest

from forge.data.hygiene import PII_TYPES, Hygiene, HygieneConfig, HygieneStats
from forge.errors import ForgeError

SECRETS = {
    "email": "jane.roe@initech.example.com",
    "phone": "(415) 555-0134",
    "credit_card": "4539 1488 0343 6467",
    "iban": "GB82 WEST 1234 5698 7654 32",
    "ssn": "219-09-9999",
    "aws_access_key": "AKIAZ7QWERTYUIOPASDF",
    "aws_secret_key": "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",
    "private_key": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oBJrzOmnDmTuoAoGCCqGSM49\n"
                   "-----END EC PRIVATE KEY-----",
    "bearer_token": "tok_9f8e7d6c5b4a39281706",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJ1c2VyIjoiYWNtZS1hZG1pbiJ9.Qm9ndXMtc2lnbmF0dXJlLXZhbHVlLTEyMzQ",
    "ip_address": "172.16.254.3",
    "github_token": "ghp_R2d2C3poBb8Yoda9Luke7Leia5Han3Solo1Xw",
    "slack_token": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "api_key": "sk-proj-Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1",
    "password": "Tr0ub4dor&3",
}
CONTEXT = {"aws_secret_key": "aws secret: {}", "bearer_token": "Authorization: Bearer {}", "password": "password={}"}


def _n(kind: str) -> int:
    """The record number of `kind`'s record in RECORDS."""
    return 10 * (PII_TYPES.index(kind) + 1)


def record(kind: str) -> str:
    return f"Ticket for {kind}: " + CONTEXT.get(kind, "value {}").format(SECRETS[kind]) + " thanks."


RECORDS = [(10 * (i + 1), record(k)) for i, k in enumerate(PII_TYPES)] + [(999, "A clean record about oncology.")]


def test_redact_mode_output_and_counts():
    h = Hygiene(HygieneConfig(dedup="off"))
    out = dict(h.process("crm", RECORDS))
    assert out[_n("private_key")] == "Ticket for private_key: value <PRIVATE_KEY> thanks."
    assert out[_n("bearer_token")] == "Ticket for bearer_token: Authorization: Bearer <BEARER_TOKEN> thanks."
    assert out[_n("iban")] == "Ticket for iban: value <IBAN> thanks."
    assert out[_n("password")] == "Ticket for password: password=<PASSWORD> thanks."
    for i, kind in enumerate(PII_TYPES):
        assert f"<{kind.upper()}>" in out[10 * (i + 1)] and SECRETS[kind] not in out[10 * (i + 1)]
    assert out[999] == "A clean record about oncology."
    m = h.stats.as_dict()
    assert all(m[f"hygiene.pii.{k}"] == 1 for k in PII_TYPES)
    assert m["hygiene.pii_records"] == m["hygiene.pii_redacted"] == len(PII_TYPES)
    assert m["hygiene.records_in"] == m["hygiene.records_out"] == len(RECORDS)
    assert m["hygiene.source.crm.pii.email"] == 1
    assert all(isinstance(v, int) for v in m.values())


def test_drop_mode_and_type_subset():
    h = Hygiene(HygieneConfig(pii="drop", pii_types=("email", "ssn"), dedup="off"))
    kept = [n for n, _ in h.process("crm", RECORDS)]
    assert _n("email") not in kept and _n("ssn") not in kept and len(kept) == len(RECORDS) - 2
    assert h.stats.pii_dropped == 2 and h.stats.pii_redacted == 0
    assert set(h.stats.pii) == {"email", "ssn"}


def test_fail_mode_names_source_line_and_type_but_not_the_value():
    h = Hygiene(HygieneConfig(pii="fail"))
    it = h.process("support_tickets", [(1, "all clean here"), (2, "nothing"), (3, record("ssn"))])
    assert next(it) == (1, "all clean here") and next(it) == (2, "nothing")  # streams until the bad one
    with pytest.raises(ForgeError) as err:
        next(it)
    msg = str(err.value)
    assert "support_tickets" in msg and "record 3" in msg and "ssn" in msg
    assert SECRETS["ssn"] not in msg and "219" not in msg
    assert err.value.__cause__ is None and err.value.__context__ is None
    assert h.stats.pii["ssn"] == 1


@pytest.mark.parametrize("kind", PII_TYPES)
def test_fail_mode_never_echoes_any_type(kind):
    with pytest.raises(ForgeError, match=f"record 7: .*{kind}") as err:
        list(Hygiene(HygieneConfig(pii="fail")).process("s", [(7, record(kind))]))
    assert SECRETS[kind] not in repr(err.value.args)


def test_values_never_reach_logs_stats_or_state(caplog):
    caplog.set_level(logging.DEBUG)
    h = Hygiene(HygieneConfig())
    out = list(h.process("crm", RECORDS + RECORDS))
    blobs = [repr(out), caplog.text, repr(h.stats), repr(h.stats.as_dict()), repr(pickle.dumps(h.state_dict()))]
    for kind, value in SECRETS.items():
        for blob in blobs:
            assert value not in blob, kind
    assert h.stats.exact_dups == len(RECORDS)  # redacted copies are exact duplicates


def test_off_mode_and_per_source_opt_out():
    h = Hygiene(HygieneConfig(pii="off", dedup="off"))
    assert list(h.process("s", RECORDS[:1])) == RECORDS[:1] and h.stats.pii == {}
    h = Hygiene(HygieneConfig(dedup="off"))
    assert list(h.process("public", RECORDS[:1], pii=False)) == RECORDS[:1]  # non-proprietary source
    assert list(h.process("crm", RECORDS[:1])) != RECORDS[:1]
    assert h.stats.sources["public"].pii_records == 0 and h.stats.sources["crm"].pii_records == 1


def test_streaming_is_lazy_and_handles_100k_records():
    consumed = 0

    def gen(n):
        nonlocal consumed
        for i in range(1, n + 1):
            consumed += 1
            text = f"row {i % 50_000} note" if i % 100 else f"row {i} mail user{i}@corp.example.com"
            yield i, text

    h = Hygiene(HygieneConfig())  # full default pipeline
    it = h.process("big", gen(100_000))
    assert consumed == 0  # nothing read before the first pull
    assert next(it)[0] == 1 and consumed == 1
    assert len(list(itertools.islice(it, 999))) == 999 and consumed == 1000

    consumed = 0
    h = Hygiene(HygieneConfig(dedup="exact"))
    n_out = sum(1 for _ in h.process("big", gen(100_000)))
    assert consumed == 100_000 and h.stats.records_in == 100_000
    # rows i and i + 50k repeat (49,500 pairs without an email); the redacted emails stay unique
    assert h.stats.pii["email"] == 1_000 and h.stats.exact_dups == 49_500 and n_out == 50_500
    assert len(h._exact) == n_out  # only one 64-bit digest per kept record is held


def test_config_validation_and_stats_round_trip():
    with pytest.raises(ForgeError, match="hygiene.pii_types.*passport"):
        HygieneConfig(pii_types=("email", "passport"))
    with pytest.raises(ForgeError, match="hygiene.near_threshold"):
        HygieneConfig(near_threshold=1.5)
    with pytest.raises(ForgeError, match="hygiene.pii"):
        HygieneConfig(pii="mask")
    assert HygieneConfig(pii_types=["ssn", "email"]).pii_types == ("email", "ssn")
    s = HygieneStats(records_in=3, pii={"email": 1})
    s.sources["a/b c"] = HygieneStats(records_in=3)
    assert HygieneStats.from_state(s.to_state()) == s
    assert s.as_dict()["hygiene.source.a/b c.records_in"] == 3
