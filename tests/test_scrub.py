"""`forge.scrub.scrub` on each shape of secret it must catch (issue 34, item 3), checked against
detect-secrets' plugin list: a value after a key that names a secret, in every way configs and
command lines write one (`key=value`, `key: value`, JSON, `--key value`), the known token shapes
(AWS secret keys beside their id, Hugging Face, GitHub, GitLab, OpenAI/Anthropic, Stripe, Slack,
SendGrid, npm, PyPI, Discord, Telegram, Twilio, Mailchimp, Square, Google, JWTs, PEM blocks, URL
passwords); and the look-alikes in forge's own text that must stay readable (`tokens=1234`,
`train/tokens`, `tokens_per_s=12.5`, tokenizer special tokens, hashes, run ids). A hypothesis test
embeds a generated secret of every shape in random text: it never survives."""
from __future__ import annotations

import base64
import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from forge.scrub import scrub, scrub_dict, scrub_tree

ALNUM = string.ascii_letters + string.digits
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HF = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZabcdEFGH"


def _b64url(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


JWT = f"{_b64url({'alg': 'HS256', 'typ': 'JWT'})}.{_b64url({'sub': 'u1234567'})}.Sf1KxwRJSMeKKF2QT4fwpMeJf36POk6yJV"

# (what, text, the secret that must go)
CAUGHT = [
    ("the issue's error", f"RuntimeError: aws_secret_access_key={AWS_SECRET} hf={HF}", AWS_SECRET),
    ("the issue's error, hf", f"RuntimeError: aws_secret_access_key={AWS_SECRET} hf={HF}", HF),
    ("key=value", "token=hunter2", "hunter2"),
    ("GitLab feed token", "feed glft-Ab3dEf6hIj9kLm2nOp5q", "glft-Ab3dEf6hIj9kLm2nOp5q"),
    ("GitLab runner registration", "GR1348941Ab3dEf6hIj9kLm2nOp5q", "GR1348941Ab3dEf6hIj9kLm2nOp5q"),
    ("Slack xoxo-", "xoxo-523423-234243-234233-e039d02840a0b9379c", "e039d02840a0b9379c"),
    ("SSH2 private key", "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nP2/56wAAAi4AAAA3aWYtbW9kbnt\n"
     "---- END SSH2 ENCRYPTED PRIVATE KEY ----", "P2/56wAAAi4AAAA3aWYtbW9kbnt"),
    ("key: value", "secret: hunter2", "hunter2"),
    ("JSON", '{"api_key": "abc123def"}', "abc123def"),
    ("JSON, camelCase", '{"clientSecret": "s3cr3tvalue"}', "s3cr3tvalue"),
    ("Python repr", "{'access_token': 'tok-0987xyz'}", "tok-0987xyz"),
    ("key=\"value\"", 'password="correct horse"', "correct horse"),
    ("spaces around =", "HF_TOKEN = plainvalue9", "plainvalue9"),
    ("upper case, prefixed", "HF_TOKEN=abcdef12345", "abcdef12345"),
    ("prefixed password", "db_password=letmein", "letmein"),
    ("--key value", "forge-worker --token hunter2 --verbose", "hunter2"),
    ("--key=value", "run --api-key=zz9plural", "zz9plural"),
    ("--kebab-key value", "cli --hf-token abcdEFGH1234 next", "abcdEFGH1234"),
    ("private_key=", "private_key=MIIBOgIBAAJB", "MIIBOgIBAAJB"),
    ("credentials", "credentials: Xy7#pq", "Xy7#pq"),
    ("query string", "GET /score?access_token=q1w2e3r4&n=2", "q1w2e3r4"),
    ("a key inside another's value", "note: token=hunter2", "hunter2"),
    ("a key inside a JSON string", '{"detail": "failed with secret=s3cr3t!"}', "s3cr3t!"),
    ("Azure connection string", "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=" + "Ab1+" * 22 + ";",
     "Ab1+" * 22),
    ("S3 presigned URL", "https://b.s3.amazonaws.com/k?X-Amz-Security-Token=IQoJb3JpZ2luX2VjEJr%2F&X-Amz-Signature="
     "4f1e2d3c4b5a69788796a5b4c3d2e1f0", "4f1e2d3c4b5a69788796a5b4c3d2e1f0"),
    ("S3 presigned URL, token", "https://b.s3.amazonaws.com/k?X-Amz-Security-Token=IQoJb3JpZ2luX2VjEJr%2F&x=1",
     "IQoJb3JpZ2luX2VjEJr%2F"),
    ("IBM Cloud IAM key (detect-secrets' keyword form)", "ibm-cloud-iam-key: 1Ab2Cd3Ef4Gh5Ij6Kl7Mn8Op9Qr0St1Uv2Wx3Yz4Ab5C",
     "1Ab2Cd3Ef4Gh5Ij6Kl7Mn8Op9Qr0St1Uv2Wx3Yz4Ab5C"),
    ("Authorization: Basic", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("AWS secret beside its id", f"{AWS_ID} {AWS_SECRET}", AWS_SECRET),
    ("AWS secret key=", f"aws_secret_access_key={AWS_SECRET}", AWS_SECRET),
    ("Hugging Face", f"pushing with {HF} now", HF),
    ("GitHub classic", "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5", "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"),
    ("GitHub fine-grained", "github_pat_11ABCDEFG0123456789abc_" + "x1Y2" * 15, "x1Y2" * 15),
    ("GitLab", "glpat-Ab3De5Gh7Jk9Lm1No3Pq", "glpat-Ab3De5Gh7Jk9Lm1No3Pq"),
    ("OpenAI", "sk-proj-Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1", "sk-proj-Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1"),
    ("Anthropic", "sk-ant-api03-Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1_xY", "sk-ant-api03-Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1_xY"),
    ("Stripe secret", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("Stripe restricted", "rk_live_4eC39HqLyjWDarjtT1zdp7dc", "rk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("Slack", "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("SendGrid", "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",
     "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr"),
    ("npm", "npm_" + "Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1xY2zA4", "Ab3De5Gh7Jk9Lm1No3Pq5Rs7Tu9Vw1xY2zA4"),
    ("PyPI", "pypi-AgEIcHlwaS5vcmcCJGE" + "x1Y2_z-" * 10, "x1Y2_z-" * 10),
    ("Discord bot", "MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs", "ZnCjm1XVW7vRze4b7Cq4se7kKWs"),
    ("Telegram bot", "bot 110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1 ok", "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1"),
    ("Twilio API key", "SK" + "0123456789abcdef" * 2, "0123456789abcdef" * 2),
    ("Mailchimp", "key 0123456789abcdef0123456789abcdef-us12", "0123456789abcdef0123456789abcdef-us12"),
    ("Square", "sq0atp-1a2B3c4D5e6F7g8H9i0J1k", "sq0atp-1a2B3c4D5e6F7g8H9i0J1k"),
    ("Google API key", "AIzaSyD-1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6", "AIzaSyD-1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6"),
    ("Artifactory", "AKCp8" + "kQ3xZ7" * 11, "AKCp8" + "kQ3xZ7" * 11),
    ("JWT", f"cookie {JWT}", JWT),
    ("PEM", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oEJ5\n-----END EC PRIVATE KEY-----",
     "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oEJ5"),
    ("URL basic auth", "https://ann:pa55word@hub.example.com/x", "pa55word"),
]


@pytest.mark.parametrize("what, text, secret", CAUGHT, ids=[c[0] for c in CAUGHT])
def test_scrub_catches(what, text, secret):
    out = scrub(text)
    assert secret not in out, f"{what}: {out!r}"
    assert scrub(out) == out  # scrubbing twice changes nothing more (run.json is compared on --resume)


def test_the_key_stays_readable_and_the_value_becomes_a_placeholder():
    assert scrub("token=hunter2") == "token=<SECRET>"
    assert scrub('{"api_key": "abc123def", "n": 3}') == '{"api_key": "<SECRET>", "n": 3}'
    assert scrub("forge-worker --token hunter2 --verbose") == "forge-worker --token <SECRET> --verbose"


def test_a_yaml_style_word_after_a_secret_key_is_a_value_unless_the_sentence_goes_on():
    assert scrub("password: letmein") == "password: <SECRET>"
    assert scrub("db:\n  token: abcdefgh\n  api_key: abcdefghij\n") == "db:\n  token: <SECRET>\n  api_key: <SECRET>\n"
    assert scrub("the secret: nobody knows") == "the secret: nobody knows"


# forge's own words and figures that look like a key and a value: they stay as they are
KEPT = [
    "tokens=1234", "train/tokens=3000000000", "token count: 12", "tokens_per_s=12.5", "max_new_tokens=4",
    "num_tokens: 3000", "pad_token=<pad>", "eos_token: </s>", "bos_token=[CLS]", "pad_token_id=0",
    "token_id=5", "tokenizer=gpt2", "--max-tokens 4", "secret_name=hf-token", "api_key_env=OPENAI_API_KEY",
    "--token-file /run/token.txt", "password: required", "the secret: nobody knows", "token: the next word",
    "password=${DB_PASSWORD}", "password_min_length=12", "is_secret=true", "sort_key=length", "key=train/loss",
    "run 0123456789abcdef0123456789abcdef finished", "commit 3608f93a1b2c3d4e5f60718293a4b5c6d7e8f901",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "sk-learn and risk-free",
    "stage 1/2: cpt (pretrain) from /tmp/run/base; loss=2.345 tokens=3000000000",
    "https://huggingface.co/datasets/hf_internal_testing/x", "token: 12345", "tokens: [1, 2, 3]",
    "credentials: /home/ann/.aws/credentials", "max_token=16", "auth: none",
]


@pytest.mark.parametrize("text", KEPT)
def test_scrub_keeps_ordinary_text(text):
    assert scrub(text) == text


# ------------------------------------------------------------------- generated secrets, random text
def _word(alphabet: str, n: int) -> st.SearchStrategy[str]:
    """n characters of `alphabet`, with a digit, an upper and a lower case letter (random-looking)."""
    return st.text(alphabet, min_size=n - 3, max_size=n - 3).map(lambda s: "a7Q" + s)


def _hex(n: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdef", min_size=n, max_size=n).filter(lambda s: any(c.isalpha() for c in s))


B64 = ALNUM + "+/"
URLSAFE = ALNUM + "_-"
KEYS = ["token", "secret", "password", "passwd", "api_key", "apiKey", "access_key", "private_key", "credential",
        "aws_secret_access_key", "HF_TOKEN", "db_password", "client_secret", "x-api-key", "auth_token"]

# (shape, strategy of (text with the secret, the secret))
SHAPES: dict[str, st.SearchStrategy[tuple[str, str]]] = {
    "keyed": st.tuples(st.sampled_from(KEYS), st.sampled_from(["={}", ": {}", '="{}"', "='{}'", '": "{}"']),
                       _word(URLSAFE + "!#%*", 12)).map(lambda t: (t[0] + t[1].format(t[2]), t[2])),
    "--key value": st.tuples(st.sampled_from(KEYS), _word(ALNUM, 12)).map(
        lambda t: (f"--{t[0].replace('_', '-')} {t[1]}", t[1])),
    "aws pair": st.tuples(_word(string.ascii_uppercase + string.digits, 16), _word(B64, 40)).map(
        lambda t: (f"AKIA{t[0].upper()} {t[1]}", t[1])),
    "aws keyed": _word(B64, 40).map(lambda s: (f"aws_secret_access_key={s}", s)),
    "hf": _word(string.ascii_letters, 34).map(lambda s: ("hf_" + s, s)),
    "github": _word(ALNUM, 36).map(lambda s: ("ghp_" + s, s)),
    "github_pat": st.tuples(_word(ALNUM, 22), _word(ALNUM, 59)).map(lambda t: (f"github_pat_{t[0]}_{t[1]}", t[1])),
    "gitlab": _word(URLSAFE, 20).map(lambda s: ("glpat-" + s, s)),
    "openai": _word(URLSAFE, 48).map(lambda s: ("sk-proj-" + s, s)),
    "anthropic": _word(URLSAFE, 95).map(lambda s: ("sk-ant-api03-" + s, s)),
    "stripe": st.tuples(st.sampled_from(["sk", "rk"]), _word(ALNUM, 24)).map(lambda t: (f"{t[0]}_live_{t[1]}", t[1])),
    "slack": st.tuples(st.sampled_from("bpars"), _word(ALNUM, 24)).map(
        lambda t: (f"xox{t[0]}-123456789012-1234567890123-{t[1]}", t[1])),
    "sendgrid": st.tuples(_word(URLSAFE, 22), _word(URLSAFE, 43)).map(lambda t: (f"SG.{t[0]}.{t[1]}", t[1])),
    "npm": _word(ALNUM, 36).map(lambda s: ("npm_" + s, s)),
    "pypi": _word(URLSAFE, 70).map(lambda s: ("pypi-AgEIcHlwaS5vcmc" + s, s)),
    "discord": st.tuples(_word(URLSAFE, 23), _word(URLSAFE, 6), _word(URLSAFE, 27)).map(
        lambda t: (f"M{t[0]}.{t[1]}.{t[2]}", t[2])),
    "telegram": _word(URLSAFE, 35).map(lambda s: (f"110201543:{s}", s)),
    "twilio": _hex(32).map(lambda s: ("SK" + s, s)),
    "mailchimp": _hex(32).map(lambda s: (f"{s}-us12", s)),
    "square": _word(URLSAFE, 22).map(lambda s: ("sq0atp-" + s, s)),
    "google": _word(URLSAFE, 35).map(lambda s: ("AIza" + s, s)),
    "jwt": _word(URLSAFE, 30).map(lambda s: (f"{_b64url({'alg': 'HS256'})}.{_b64url({'sub': 'x'})}.{s}", s)),
    "pem": st.lists(_word(B64, 64), min_size=1, max_size=3).map(
        lambda lines: ("-----BEGIN PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END PRIVATE KEY-----", lines[0])),
    "url": _word(ALNUM, 12).map(lambda s: (f"https://ann:{s}@example.com/x", s)),
}
PROSE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(SHAPES)), data=st.data(), before=PROSE, after=PROSE)
def test_a_generated_secret_of_every_shape_never_survives_in_random_text(shape, data, before, after):
    text, secret = data.draw(SHAPES[shape])
    assume(secret not in before + after)  # the random text may happen to hold it
    out = scrub(f"{before} {text} {after}")
    assert secret not in out, (shape, out)


def test_scrub_tree_replaces_a_value_whose_key_names_a_secret():
    tree = {"token": "hunter2", "n": [{"clientSecret": "abc def"}], "headers": {"Authorization": "Basic dXNlcjpw"},
            "pad_token": "<pad>", "tokens": "12", "hf_token": "${HF_TOKEN}", "password": "", "api_key": 3}
    assert scrub_tree(tree) == {"token": "<SECRET>", "n": [{"clientSecret": "<SECRET>"}],
                                "headers": {"Authorization": "<SECRET>"}, "pad_token": "<pad>", "tokens": "12",
                                "hf_token": "${HF_TOKEN}", "password": "", "api_key": 3}
    assert scrub_dict({"db_password": "letmein", "name": "tiny"}) == {"db_password": "<SECRET>", "name": "tiny"}
    assert scrub_tree(scrub_tree(tree)) == scrub_tree(tree)


def test_an_errors_first_line_is_scrubbed_before_it_is_cut():
    """A secret that straddles the message limit must not survive in part."""
    from forge.scrub import first_line

    secret = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3"
    error = RuntimeError("x" * 290 + " hf=" + secret + "\nsecond line")
    line = first_line(error)
    assert len(line) <= 300 and "second" not in line
    assert not any(secret[:n] in line for n in range(6, len(secret) + 1))
    assert first_line(RuntimeError("")) == "RuntimeError"
