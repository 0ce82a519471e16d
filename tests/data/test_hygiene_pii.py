"""PII and secret detection: true positives, look-alikes that must stay, exact redactions."""
from __future__ import annotations

import dataclasses

import pytest

from forge.data.pii import PII_TYPES, Finding, redact, scan_pii
from forge.data.pii_checks import iban_ok, luhn_ok, ssn_ok

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
       "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----")

# (type, text, expected redaction)
POSITIVES = [
    ("email", "Write to jane.doe+hr@mail.example.co.uk today.", "Write to <EMAIL> today."),
    ("email", "(bob_smith@acme.io)", "(<EMAIL>)"),
    ("phone", "Call (555) 123-4567 now", "Call <PHONE> now"),
    ("phone", "Call 555-123-4567 or 555.987.6543", "Call <PHONE> or <PHONE>"),
    ("phone", "Hotline 1-800-555-0199.", "Hotline <PHONE>."),
    ("phone", "London office: +44 20 7946 0958", "London office: <PHONE>"),
    ("phone", "mobile: 0612345678", "mobile: <PHONE>"),
    ("credit_card", "Visa 4111 1111 1111 1111 exp 12/25", "Visa <CREDIT_CARD> exp 12/25"),
    ("credit_card", "mc=5555555555554444;", "mc=<CREDIT_CARD>;"),
    ("credit_card", "Amex 3782-822463-10005.", "Amex <CREDIT_CARD>."),
    ("iban", "IBAN DE89 3704 0044 0532 0130 00 please", "IBAN <IBAN> please"),
    ("iban", "to GB82WEST12345698765432.", "to <IBAN>."),
    ("iban", "FR1420041010050500013M02606", "<IBAN>"),
    ("ssn", "SSN 123-45-6789.", "SSN <SSN>."),
    ("ssn", "social security number: 078051121", "social security number: <SSN>"),
    ("aws_access_key", "key AKIAIOSFODNN7EXAMPLE here", "key <AWS_ACCESS_KEY> here"),
    ("aws_access_key", "ASIAY34FZKBOKMUTVV7A", "<AWS_ACCESS_KEY>"),
    ("aws_secret_key", f"aws_secret_access_key = {AWS_SECRET}\n",
     "aws_secret_access_key = <AWS_SECRET_KEY>\n"),
    ("aws_secret_key", f'{{"SecretAccessKey": "{AWS_SECRET}"}}', '{"SecretAccessKey": "<AWS_SECRET_KEY>"}'),
    ("private_key", f"key:\n{PEM}\nend", "key:\n<PRIVATE_KEY>\nend"),
    ("private_key",  # JSON-escaped newlines
     "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA\\n-----END OPENSSH PRIVATE KEY-----",
     "<PRIVATE_KEY>"),
    ("private_key", "cut: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEF\nAASCBKcwggSjAgEAAoIBAQC7\n\nNext.",
     "cut: <PRIVATE_KEY>\n\nNext."),
    ("bearer_token", "Authorization: Bearer 8f3kLq-92jd_Xx0.aa9Zk", "Authorization: Bearer <BEARER_TOKEN>"),
    ("jwt", f"token={JWT}&x=1", "token=<JWT>&x=1"),
    ("jwt", f"Authorization: Bearer {JWT}", "Authorization: Bearer <JWT>"),
    ("ip_address", "from 192.168.1.20, then 8.8.8.8.", "from <IP_ADDRESS>, then <IP_ADDRESS>."),
    ("ip_address", "host 2001:db8::8a2e:370:7334 and ::ffff:10.0.0.1", "host <IP_ADDRESS> and <IP_ADDRESS>"),
    # issue 8, item 10: tokens, passwords, and disguised personal data
    ("github_token", f"export GH=ghp_{'aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5'} done", "export GH=<GITHUB_TOKEN> done"),
    ("github_token", "pat github_pat_11ABCDEFG0123456789abc_" + "x1Y2" * 15 + "end.",
     "pat <GITHUB_TOKEN>."),
    ("slack_token", "SLACK_BOT=xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
     "SLACK_BOT=<SLACK_TOKEN>"),
    ("slack_token", "token xoxp-2718281828-3141592653-aZ9bY8cX7", "token <SLACK_TOKEN>"),
    ("api_key", "OPENAI_API_KEY=sk-proj-Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1", "OPENAI_API_KEY=<API_KEY>"),
    ("api_key", "use sk-4fJk2LmN8pQrS1tUvWx3YzAb5CdEf6Gh, not mine", "use <API_KEY>, not mine"),
    ("password", "db: host=10x password=Tr0ub4dor&3 port=5432", "db: host=10x password=<PASSWORD> port=5432"),
    ("password", "login with pwd: hunter2!", "login with pwd: <PASSWORD>"),
    ("password", '{"user": "ann", "password": "correct horse battery"}', '{"user": "ann", "password": "<PASSWORD>"}'),
    ("password", "MYSQL_ROOT_PASSWORD=s3cr3t", "MYSQL_ROOT_PASSWORD=<PASSWORD>"),
    ("phone", "reach me at 4155550123 after six", "reach me at <PHONE> after six"),
    ("phone", "Call (５５５) １２３-４５６７ now", "Call <PHONE> now"),
    ("email", "Write to josé.garcía@correo.example.es now", "Write to <EMAIL> now"),
    ("email", "联系 用户@例子.广告 谢谢", "联系 <EMAIL> 谢谢"),
    ("email", "mail maria\u200b.lopez@exa\u200cmple.org today", "mail <EMAIL> today"),
    ("email", "ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ", "<EMAIL>"),
    ("credit_card", "card ４１１１ １１１１ １１１１ １１１１ ok", "card <CREDIT_CARD> ok"),
    ("iban", "iban: de89 3704 0044 0532 0130 00 thanks", "iban: <IBAN> thanks"),
    ("iban", "pay to gb82west12345698765432 (IBAN)", "pay to <IBAN> (IBAN)"),
]

# (type whose detector must stay silent, text): every type is scanned, none may fire.
NEGATIVES = [
    ("email", "foo@bar has no TLD"),
    ("email", "npm i lodash@4.17.21 and icon@2x.png"),
    ("phone", "on 2024-01-15 at 10:30"),
    ("phone", "order 5551234567 shipped"),           # bare digits, no phone context
    ("phone", "call us on 2024-01-15"),               # a date even after "call"
    ("credit_card", "card 4111 1111 1111 1112"),      # fails Luhn
    ("credit_card", "order 1234567890123456"),         # no card network starts with 1
    ("iban", "DE89 3704 0044 0532 0130 01 is a typo"),  # bad mod-97 checksum
    ("iban", "XX89370400440532013000"),                # unknown country
    ("ssn", "912-45-6789"),                           # 9xx area
    ("ssn", "666-12-3456 and 000-12-3456"),           # 666 and 000 areas
    ("ssn", "123-00-4567 and 123-45-0000"),           # 00 group, 0000 serial
    ("ssn", "part 123456789"),                         # bare 9 digits need an SSN context
    ("aws_access_key", "AKIAIOSFODNN7EXAMPL short and XAKIAIOSFODNN7EXAMPLE glued"),
    ("aws_secret_key", "aws commit 3f786850e387550fdab836ed7e6dc881de23001b"),  # git SHA
    ("aws_secret_key", f"random blob {AWS_SECRET} with no context"),
    ("private_key", "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0B\n-----END PUBLIC KEY-----"),
    ("private_key", "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n-----END CERTIFICATE-----"),
    ("bearer_token", "the bearer of this letter holds bearer instruments"),
    ("jwt", "eyJhbGciOi.eyJzdWIiOiIx.abc is not base64 json"),
    ("ip_address", "999.1.1.1 and 256.10.10.10"),
    ("ip_address", "version 1.2.3.4, v1.2.3.4, pkg==1.2.3.4, 1.2.3.4.5 and 01.2.3.4"),
    ("ip_address", "at 12:30:45, std::vector, MAC 00:1A:2B:3C:4D:5E"),
    ("github_token", "ghp_short and the ghp_ prefix, gho_123"),
    ("slack_token", "xoxo, hugs; the xoxb-your-token-here placeholder"),
    ("api_key", "sk-learn, task-force-2024, risk-free, sk-abcdefghijklmnopqrstuvwxyz"),
    ("password", "reset your password: click the link; password: required; the password is strong"),
    ("password", "password=<REDACTED>, password: ********, PASSWORD=${DB_PASSWORD}, pwd: /home/ann"),
    ("password", "password_hash and passwords and pwd"),
    ("phone", "order 4155550123 and invoice #4155550124, epoch 1700000000, id: 9876543210"),
    ("phone", "sum 4155550123.50 and 41555501239 and v4155550123"),
    ("email", "see user@localhost and 用户@例子 without a dot"),
    ("iban", "hash de89370400440532013001 and the sha de89370400440532013000abc"),
]


@pytest.mark.parametrize("kind,text,expected", POSITIVES)
def test_finds_and_redacts(kind, text, expected):
    found = scan_pii(text)
    assert [f.type for f in found] == [kind] * len(found) and found
    assert redact(text, found) == expected


@pytest.mark.parametrize("kind,text", NEGATIVES)
def test_look_alikes_are_left_alone(kind, text):
    assert scan_pii(text) == [], kind


def test_every_type_has_a_positive_and_a_negative():
    assert {k for k, *_ in POSITIVES} == set(PII_TYPES) == {k for k, _ in NEGATIVES}


def test_findings_hold_no_value():
    (f,) = scan_pii("mail a.b@example.org")
    assert f == Finding("email", 5, 20)
    assert [x.name for x in dataclasses.fields(Finding)] == ["type", "start", "end"]
    assert f.placeholder == "<EMAIL>"


def test_mixed_record_and_type_filter():
    text = ("Contact jane@corp.com, +1 415-555-0100, SSN 123-45-6789, card 5555555555554444, "
            "server 10.0.0.7, key AKIAIOSFODNN7EXAMPLE.")
    assert redact(text, scan_pii(text)) == (
        "Contact <EMAIL>, <PHONE>, SSN <SSN>, card <CREDIT_CARD>, server <IP_ADDRESS>, key <AWS_ACCESS_KEY>.")
    only = scan_pii(text, types=["email", "ssn"])
    assert redact(text, only).startswith("Contact <EMAIL>, +1 415-555-0100, SSN <SSN>, card 5555555555554444")
    with pytest.raises(ValueError, match="passport"):
        scan_pii(text, types=["passport"])


def test_overlap_prefers_the_secret_type():
    # a PEM body is full of 40-char base64 runs; with "secret" nearby it is still one PRIVATE_KEY
    text = f"secret:\n{PEM}"
    assert [f.type for f in scan_pii(text)] == ["private_key"]


def test_checksums():
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")
    assert iban_ok("NL91ABNA0417164300") and not iban_ok("NL91ABNA0417164301")
    assert ssn_ok("123", "45", "6789") and not ssn_ok("900", "45", "6789")


def test_no_findings_in_plain_prose_and_it_is_quick():
    import time

    text = ("Leukemia may affect red blood cells, white blood cells, and platelets. In 2019 about 6,150 "
            "people were treated at 12 centers; see section 4.2 and table 3 (p < 0.05). ") * 200
    t0 = time.perf_counter()
    assert scan_pii(text) == []
    assert time.perf_counter() - t0 < 1.0


def test_private_key_blocks_with_and_without_end():
    text = ("a -----BEGIN PRIVATE KEY-----\nAAAAAAAAAAAAAAAAAAAAAAAA\n-----END PRIVATE KEY----- b "
            "-----BEGIN PRIVATE KEY-----\nBBBBBBBBBBBBBBBBBBBBBBBB\n\nc -----BEGIN EC PRIVATE KEY-----\nCCCC\n"
            "-----END EC PRIVATE KEY----- d")
    assert redact(text, scan_pii(text)) == "a <PRIVATE_KEY> b <PRIVATE_KEY>\n\nc <PRIVATE_KEY> d"
    flat = "x -----BEGIN RSA PRIVATE KEY----- MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgO VTLw7onLRnrq0/IzW7yWR7Qk rest"
    assert redact(flat, scan_pii(flat)) == "x <PRIVATE_KEY> rest"


@pytest.mark.parametrize("text", [
    "1" * 50_000, "call " + "12 " * 15_000, "a." * 25_000 + "@", "x@" + "a-" * 25_000, "a:" * 25_000,
    "aws " + "Ab1+" * 12_000, "-----BEGIN PRIVATE KEY-----\n" * 1_000, "DE" + "12" * 25_000,
    "1.1." * 12_000, "eyJ" + "a" * 25_000 + ".eyJ" + "b" * 25_000, "(555) " * 8_000,
])
def test_pathological_inputs_do_not_hang(text):
    """A regex with catastrophic backtracking would run for hours on these; the alarm is a hang
    detector far above any real timing (speed itself is measured in bench/, not asserted here)."""
    import signal

    def hung(*_):
        raise TimeoutError("scan_pii backtracked catastrophically")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        scan_pii(text)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
