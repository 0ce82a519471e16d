"""No secret reaches anything forge writes (issue 18, item 4): ten kinds of secret are planted in a
reward's exception message, a reward URL, a data path and the environment; a tiny `forge run` that
fails on the reward, a tiny finished run and its `forge export` are made, and every byte of every
file under the output folders (the MLflow store and its artifacts included), the export folder and
what was printed is searched for each one. Unit tests of `forge.scrub` say what it keeps (each
shape it catches: tests/test_scrub.py). Issue 34, item 3: a reward raising `aws_secret_access_key=...
hf=hf_... token=...` leaves none of them in any text of mlflow.db (tags, params, notes, metric
names), the run folder or the output; `forge reward verify`, `forge validate`, a reward URL's metric
names and an export's MLflow record print or write none either."""
from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path

import pytest

from forge import cli
from forge.scrub import scrub, scrub_tree
from forge_testing import base_recipe, pretrain_stage, write_recipe

ENV_NAMES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN", "OPENAI_API_KEY", "GITHUB_TOKEN",
             "MLFLOW_TRACKING_PASSWORD", "DATABASE_URL", "WANDB_API_KEY")


def _alnum(n: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "a1" + "".join(secrets.choice(alphabet) for _ in range(n - 2))


def _b64url(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def plant() -> dict[str, str]:
    """Kind -> the planted secret (each random, so that finding it anywhere means it leaked)."""
    digits = "".join(secrets.choice("0123456789") for _ in range(7))
    key_body = "\n".join(base64.b64encode(os.urandom(48)).decode() for _ in range(4))
    return {
        "env": base64.b64encode(os.urandom(30)).decode(),  # AWS_SECRET_ACCESS_KEY's value, 40 characters
        "github": "ghp_" + _alnum(36),
        "openai": "sk-proj-" + _alnum(40),
        "url_password": "pw" + secrets.token_hex(10),
        "private_key": key_body,
        "jwt": f"{_b64url({'alg': 'HS256', 'typ': 'JWT'})}.{_b64url({'sub': secrets.token_hex(8)})}."
               f"{_alnum(30)}",
        "slack": f"xoxb-{digits}{digits[:5]}-{digits}{digits[::-1][:5]}-{_alnum(24)}",
        "query_password": "Qp" + secrets.token_hex(10),
        "bearer": f"{_alnum(20)}.{_alnum(20)}",
        "email": f"jane.{secrets.token_hex(4)}@example.com",
        "phone": f"415-{digits[:3]}-{digits[3:]}",
    }


def _needles(p: dict[str, str]) -> dict[str, str]:
    """What must not appear: the secret, or for a private key each line of its body."""
    out = {k: v for k, v in p.items() if k != "private_key"}
    out.update({f"private_key[{i}]": line for i, line in enumerate(p["private_key"].splitlines())})
    return out


def _message(p: dict[str, str]) -> str:
    return (f"grader crashed: github {p['github']}, openai {p['openai']}, jwt {p['jwt']}, slack {p['slack']}, "
            f"Authorization: Bearer {p['bearer']}, contact {p['email']} or call {p['phone']}\n"
            f"-----BEGIN RSA PRIVATE KEY-----\n{p['private_key']}\n-----END RSA PRIVATE KEY-----")


def _environment(monkeypatch, p: dict[str, str]) -> None:
    for name in ENV_NAMES:
        monkeypatch.setenv(name, f"PLANTED{secrets.token_hex(12)}")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", p["env"])


def _pii_folder(tmp: Path, p: dict[str, str]) -> Path:
    """A data folder whose name holds an email address and a phone number (echoed in records)."""
    folder = tmp / f"contact {p['email']} tel {p['phone']}"
    folder.mkdir()
    return folder


def _leaks(needles: dict[str, str], roots: list[Path], printed: str) -> list[str]:
    found = []
    files = [f for root in roots for f in root.rglob("*") if f.is_file()]
    blobs = [(str(f), f.read_bytes()) for f in files] + [("printed output", printed.encode())]
    for kind, value in needles.items():
        where = [name for name, blob in blobs if value.encode() in blob or value in name]
        found += [f"{kind} in {w}" for w in where]
    return found


@pytest.mark.slow
def test_planted_secrets_reach_no_file_store_or_output(tmp_path, monkeypatch, capfd):
    p = plant()
    _environment(monkeypatch, p)
    data = _pii_folder(tmp_path, p)
    (data / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Say something about {i}."}) + "\n"
                                                for i in range(8)))
    (data / "notes.txt").write_text("\n\n".join(f"Note {i}: the river runs past the mill." for i in range(80)))
    (tmp_path / "rewards.py").write_text(
        f"import os\nMESSAGE = {_message(p)!r}\n\n"
        "def leak(prompts, completions, **fields):\n"
        "    raise RuntimeError(os.environ['AWS_SECRET_ACCESS_KEY'] + ' ' + MESSAGE)\n")
    url = f"http://forge:{p['url_password']}@127.0.0.1:9/score?password={p['query_password']}"

    failing = base_recipe(tmp_path / "a", stages=[
        {"name": "rl", "kind": "rft", "data": ["p"], "rewards": [{"source": "rewards.py:leak"}, {"source": url}],
         "max_steps": 1, "seq_len": 64, "batch_size": 2, "group": 2, "max_new_tokens": 4, "optim": {"lr": 1e-3}}])
    failing["data"]["p"] = {"path": str(data / "prompts.jsonl"), "holdout": 0.0}
    assert cli.main(["run", str(write_recipe(tmp_path / "fails.yaml", failing))]) != 0

    finished = base_recipe(tmp_path / "b", stages=[pretrain_stage(max_steps=2, mixture={"general": 0.5,
                                                                                         "notes": 0.5})])
    finished["data"]["notes"] = {"path": str(data / "notes.txt"), "proprietary": True}
    assert cli.main(["run", str(write_recipe(tmp_path / "ok.yaml", finished))]) == 0
    exported = tmp_path / "export"
    assert cli.main(["export", str(tmp_path / "b" / "out" / "novella"), "--out", str(exported)]) == 0

    seen = capfd.readouterr()
    printed = seen.out + seen.err
    assert "grader crashed" in printed and "leak" in printed  # the error was reported, scrubbed
    roots = [tmp_path / "a" / "out", tmp_path / "b" / "out", exported]
    assert all((r / "mlflow.db").is_file() for r in roots[:2]) and (exported / "MODEL_CARD.md").is_file()
    needles = {**_needles(p), **{n: os.environ[n] for n in ENV_NAMES}}
    leaked = _leaks(needles, roots, printed)
    assert not leaked, "planted secrets found:\n" + "\n".join(leaked)


# ---------------------------------------------------------------------------------- the scrubber
def test_scrub_removes_each_kind_and_keeps_ordinary_text(monkeypatch):
    p = plant()
    _environment(monkeypatch, p)
    text = scrub(f"{p['env']} " + _message(p) + f" http://u:{p['url_password']}@h:1/x?password={p['query_password']}")
    assert not [k for k, v in _needles(p).items() if v in text]
    assert "<env:AWS_SECRET_ACCESS_KEY>" in text and "http://u:***@h:1/x" in text
    assert scrub(text) == text  # scrubbing twice changes nothing more (run.json is compared on --resume)
    ordinary = ("stage 1/2: cpt (pretrain) from /tmp/run/base; loss=2.345 tokens=3000000000 "
                "sqlite:////tmp/run/mlflow.db http://127.0.0.1:5000 models:/tiny@champion run 0123abcd" * 2)
    assert scrub(ordinary) == ordinary


def test_scrub_tree_scrubs_strings_only_and_keeps_the_shape(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-0123456789abcdef")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false-but-long-enough")  # not a secret's name
    tree = {"a": ["x tok-0123456789abcdef y", 3000000000, 1.5, None, True],
            "b": {"url": "postgresql://me:hunter2@db:5432/x"}, "c": "false-but-long-enough"}
    assert scrub_tree(tree) == {"a": ["x <env:MY_SERVICE_TOKEN> y", 3000000000, 1.5, None, True],
                                "b": {"url": "postgresql://me:***@db:5432/x"}, "c": "false-but-long-enough"}


def test_resume_accepts_the_recipe_whose_secrets_run_json_scrubbed(tmp_path, monkeypatch):
    from forge.recipe import load_recipe
    from forge.rundir import RUN, RunFolder, recipe_fingerprint

    monkeypatch.setenv("REWARD_API_TOKEN", "tok" + secrets.token_hex(12))
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    recipe = base_recipe(tmp_path, stages=[{"name": "rl", "kind": "rft", "data": ["p"], "max_steps": 1, "seq_len": 64,
                                            "rewards": [{"source": f"https://me:{os.environ['REWARD_API_TOKEN']}"
                                                                   "@127.0.0.1:9/score"}]}])
    recipe["data"]["p"] = {"path": str(tmp_path / "p.jsonl")}
    fingerprint = recipe_fingerprint(load_recipe(write_recipe(tmp_path / "r.yaml", recipe)))
    with RunFolder.open(tmp_path / "out", fingerprint):
        pass
    stored = (tmp_path / "out" / RUN).read_text()
    assert os.environ["REWARD_API_TOKEN"] not in stored and "https://me:***@127.0.0.1:9/score" in stored
    again = recipe_fingerprint(load_recipe(tmp_path / "r.yaml"))
    with RunFolder.open(tmp_path / "out", again, resume=True) as folder:  # an interrupted run, continued
        assert folder.record["fingerprint"] == again


# ------------------------------------------------ issue 34, item 3: the error of a failing reward
def _issue_secrets() -> dict[str, str]:
    """An AWS secret key and a Hugging Face token, random (found anywhere = leaked)."""
    return {"aws": "wJ" + base64.b64encode(os.urandom(29)).decode()[:38].replace("=", "x"),
            "hf": "hf_" + _alnum(34), "plain": "hunter" + secrets.token_hex(4)}


def _raising_reward(folder: Path, p: dict[str, str]) -> Path:
    (folder / "leaky.py").write_text(
        f"MESSAGE = {'aws_secret_access_key=' + p['aws'] + ' hf=' + p['hf'] + ' token=' + p['plain']!r}\n\n"
        "def leak(prompts, completions, **fields):\n"
        "    raise RuntimeError(MESSAGE)\n\n"
        "def lambda_handler(event, context):\n"
        "    raise RuntimeError(MESSAGE)\n")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}.", "answer": "x"}) + "\n"
                               for i in range(4)))
    return prompts


def _store_strings(db: Path) -> list[tuple[str, str]]:
    """(table.column, value) of every text value in an MLflow sqlite store."""
    import sqlite3

    out = []
    with sqlite3.connect(db) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            cursor = con.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cursor.description]
            for row in cursor:
                out += [(f"{table}.{n}", v if isinstance(v, str) else v.decode("utf-8", "replace"))
                        for n, v in zip(names, row) if isinstance(v, (str, bytes))]
    return out


@pytest.mark.slow
def test_a_reward_error_with_secrets_leaves_none_in_the_mlflow_store(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = _issue_secrets()
    prompts = _raising_reward(tmp_path, p)
    stage = {"name": "rl", "kind": "rft", "data": ["p"], "max_steps": 1, "batch_size": 2, "group": 2,
             "seq_len": 64, "max_new_tokens": 4, "rewards": [{"source": "leaky.py:leak"}]}
    recipe = base_recipe(tmp_path, stages=[stage], tracking={"register_model": False},
                         eval={"domain": [], "general": []})
    recipe["data"]["p"] = {"path": str(prompts), "holdout": 0.0}
    assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) != 0
    seen = capfd.readouterr()
    printed = seen.out + seen.err
    assert "leaky.py:leak" in printed and "aws_secret_access_key=" in printed  # the error was reported

    stored = _store_strings(tmp_path / "out" / "mlflow.db")
    errors = [v for where, v in stored if "aws_secret_access_key" in v]
    assert errors, "the reward's error reached no tag of the store"  # so the search below means something
    leaked = [f"{kind} in {where}" for kind, secret in p.items() for where, v in stored if secret in v]
    leaked += [f"{kind} printed" for kind, secret in p.items() if secret in printed]
    leaked += _leaks(p, [tmp_path / "out"], "")
    assert not leaked, "\n".join(leaked)


@pytest.mark.parametrize("function, protocol", [("leak", "forge"), ("lambda_handler", "nova")])
def test_reward_verify_prints_no_secret(tmp_path, capfd, monkeypatch, function, protocol):
    monkeypatch.chdir(tmp_path)
    p = _issue_secrets()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", p["aws"])  # forge run scrubs it by name too
    prompts = _raising_reward(tmp_path, p)
    assert cli.main(["reward", "verify", f"leaky.py:{function}", "--protocol", protocol, "--data", str(prompts),
                     "--n", "2"]) == 1
    seen = capfd.readouterr()
    printed = seen.out + seen.err
    assert "violation" in printed and "aws_secret_access_key=" in printed, printed
    assert not [kind for kind, secret in p.items() if secret in printed], printed


def test_reward_verify_masks_a_url_password(tmp_path, capfd):
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    password = "pw" + secrets.token_hex(8)
    code = cli.main(["reward", "verify", f"http://ann:{password}@127.0.0.1:9/score", "--data",
                     str(tmp_path / "p.jsonl"), "--n", "1", "--timeout", "5"])
    seen = capfd.readouterr()
    assert code == 1 and "127.0.0.1:9" in seen.out + seen.err
    assert password not in seen.out + seen.err


def test_validate_lists_a_reward_endpoint_without_its_token(tmp_path, capfd):
    token = "tk" + secrets.token_hex(10)
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    recipe = base_recipe(tmp_path, stages=[{"name": "rl", "kind": "rft", "data": ["p"], "max_steps": 1, "seq_len": 64,
                                            "rewards": [{"source": f"https://127.0.0.1:9/score?api_key={token}"}]}])
    recipe["data"]["p"] = {"path": str(tmp_path / "p.jsonl")}
    assert cli.main(["validate", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0
    seen = capfd.readouterr()
    assert "stages[0].rewards[0]: https://127.0.0.1:9/score?api_key=<SECRET>" in seen.out, seen.out
    assert token not in seen.out + seen.err


@pytest.mark.slow
def test_an_endpoint_password_reaches_no_metric_name(tmp_path, capfd):
    """A reward URL's password (and user) is not part of its metric names (reward.<label>...)."""
    from servers import json_server

    password = "pw" + secrets.token_hex(8)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(4)))
    with json_server(lambda body, path: {"rewards": [0.5] * len(body["completions"])}) as url:
        source = url.replace("http://", f"http://ann:{password}@") + "/score"
        stage = {"name": "rl", "kind": "rft", "data": ["p"], "max_steps": 1, "batch_size": 2, "group": 2,
                 "seq_len": 64, "max_new_tokens": 4, "log_every": 1, "rewards": [{"source": source}]}
        recipe = base_recipe(tmp_path, stages=[stage], tracking={"register_model": False},
                             eval={"domain": [], "general": []})
        recipe["data"]["p"] = {"path": str(tmp_path / "p.jsonl"), "holdout": 0.0}
        assert cli.main(["run", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 0
    seen = capfd.readouterr()
    stored = _store_strings(tmp_path / "out" / "mlflow.db")
    assert any(where == "metrics.key" and "/reward/" in v and "score" in v for where, v in stored)  # logged
    leaked = [where for where, v in stored if password in v] + _leaks({"password": password}, [tmp_path / "out"],
                                                                        seen.out + seen.err)
    assert not leaked, leaked


def test_an_exports_record_in_mlflow_is_scrubbed(tmp_path):
    """forge export/deploy log their manifest, job request and destination on the Novella's run through
    track.log_export: what it writes to the store passes forge.scrub too."""
    import mlflow

    from forge.track import log_export

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("x", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        pass
    token = "hf_" + _alnum(34)
    log_export(uri, run.info.run_id, {"manifest.json": {"notes": f"pushed with {token}", "password": "letmein99"}},
               f"https://ann:{token}@hub.example.com/x")
    client = mlflow.MlflowClient(uri)
    tags = client.get_run(run.info.run_id).data.tags
    logged = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="export/manifest.json",
                                                      dst_path=str(tmp_path / "dl"))).read_text()
    assert tags["forge.exported_uri"] == "https://ann:***@hub.example.com/x"
    assert token not in logged and "letmein99" not in logged and "<SECRET>" in logged
