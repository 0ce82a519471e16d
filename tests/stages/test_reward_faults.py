"""A customer's reward never hangs forge: Python rewards run in worker processes killed at the
deadline (hangs, exits, crashes end with a RewardError naming the source and the batch, and no
worker is left behind); HTTP rewards have a deadline for the whole call (a server that trickles a
byte every 3 s fails at timeout_s); numpy scores are scores; through `forge run`, a hanging reward
ends the run FAILED with one line and `--resume` continues, and SIGTERM ends it promptly. A fuzz
test throws random misbehaviour at both kinds of source."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from forge import cli
from forge.lm.rewards import Reward, RewardError, check_scores
from forge.recipe.rft_settings import RewardSource
from forge_testing import REPO, base_recipe, write_recipe

HERE = Path(__file__).resolve().parent
REWARDS = HERE / "rft_rewards.py"
MARGIN_S = 30.0  # the machine may be busy: a generous allowance over the deadline


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture
def no_worker_left():
    """The test's workers are all gone when it ends (rewards closed or killed)."""
    before = _children()
    yield
    end = time.monotonic() + MARGIN_S
    while _children() - before and time.monotonic() < end:
        time.sleep(0.1)
    assert not _children() - before, f"processes left behind: {_children() - before}"


def reward(source: str, **kw) -> Reward:
    return Reward(RewardSource(source=source, **kw))


# ----------------------------------------------------------------------------- Python rewards
CALL = """
import sys
from forge.lm.rewards import Reward, RewardError
from forge.recipe.rft_settings import RewardSource
r = Reward(RewardSource(source={source!r}, timeout_s=1.0))
try:
    r(["p", "q"], ["a", "b"], {{}}, batch=7)
except RewardError as e:
    print("ERROR", e)
getattr(r, "close", lambda: None)()
"""


@pytest.mark.parametrize("fn, message", [
    ("hangs_forever", r"no answer within 1s \(timeout_s\)"),
    ("exits", r"the reward called sys.exit\(3\)"),
    ("hard_exit", r"its worker process exited with status 3"),
    ("segfault", r"its worker process died of SIGSEGV"),
])
def test_python_reward_that_hangs_exits_or_crashes_ends_with_one_line(fn, message):
    """In a fresh interpreter (os._exit and a segfault must not take the caller with them): the
    call ends with the RewardError line and the interpreter then exits, promptly."""
    source = f"{REWARDS}:{fn}"
    proc = subprocess.run([sys.executable, "-c", CALL.format(source=source)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"ERROR reward {source!r} on batch 7: ")
    assert len(proc.stdout.strip().splitlines()) == 1
    assert __import__("re").search(message, proc.stdout), proc.stdout


def test_a_killed_worker_is_replaced_and_closing_leaves_no_process(no_worker_left):
    r = reward(f"{REWARDS}:chaos", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(RewardError, match=r"reward '.*:chaos' on batch 2: no answer within 1s"):
        r(["p"], ["c"], {"mode": ["hang"]}, batch=2)
    assert time.monotonic() - started < 1.0 + MARGIN_S
    assert r(["p", "q"], ["a", "b"], {"mode": ["fine", "fine"]}, batch=3) == [0.0, 0.0]  # a new worker
    r.close()


def test_numpy_scores_are_scores_numpy_bools_are_not(no_worker_left):
    assert check_scores([np.float32(0.5), np.int64(1)], 2, "w") == [0.5, 1.0]
    assert check_scores(np.array([0.25, 1.0]), 2, "w") == [0.25, 1.0]
    with pytest.raises(RewardError, match=r"^w: score 0 is .*True.*, not a finite number"):
        check_scores([np.bool_(True)], 1, "w")
    for fn, want in (("numpy_scores", [0.5, 0.5]), ("numpy_scalars", [1.0, 0.5])):
        r = reward(f"{REWARDS}:{fn}")
        assert r(["p", "q"], ["a", "b"], {}, batch=1) == want
        r.close()
    r = reward(f"{REWARDS}:numpy_bools")
    with pytest.raises(RewardError, match=r"on batch 1: score 0 is True, not a finite number"):
        r(["p"], ["a"], {}, batch=1)
    r.close()


# ----------------------------------------------------------------------------- HTTP rewards
class _Chaos(BaseHTTPRequestHandler):
    """Answers as the request's `mode` says: fine, trickle (a byte every 3 s), hang, huge, status,
    garbage, short."""

    stop = threading.Event()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n, mode = len(body["completions"]), (body.get("mode") or ["fine"])[0]
        if mode == "status":
            self.send_error(500, "grader down")
            return
        data = {"fine": json.dumps([0.5] * n), "short": json.dumps([0.5] * (n - 1)), "garbage": "<html>",
                "nan": "[NaN]" * 1}[mode] if mode in ("fine", "short", "garbage", "nan") else None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if mode == "huge":
            self.end_headers()
            chunk = b"[" + b"0.5," * 2**18
            while not self.stop.is_set():
                try:
                    self.wfile.write(chunk)
                except OSError:
                    return
            return
        if data is None:  # trickle or hang
            self.end_headers()
            while not self.stop.wait(3.0 if mode == "trickle" else 0.2):
                if mode == "trickle":
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return
            return
        raw = data.encode()
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def chaos_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chaos)
    srv.daemon_threads = True
    _Chaos.stop.clear()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/score"
    _Chaos.stop.set()
    srv.shutdown()
    srv.server_close()


def _bounded(call, limit: float):
    """Run `call` in a thread; its outcome, or a failure if it is still running after `limit`."""
    box: dict = {}

    def target():
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"the reward call was still running after {limit:.0f}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.slow
def test_http_trickle_fails_at_the_whole_call_deadline(chaos_server):
    r = reward(chaos_server, timeout_s=4.0, retries=3)  # each byte comes well within timeout_s
    started = time.monotonic()
    with pytest.raises(RewardError, match=rf"reward '{chaos_server}' on batch 5: no answer within 4s \(timeout_s\)"):
        _bounded(lambda: r(["p"], ["c"], {"mode": ["trickle"]}, batch=5), 4.0 + MARGIN_S)
    assert time.monotonic() - started < 4.0 + MARGIN_S


# ----------------------------------------------------------------------------- fuzzing
PY_MODES = ["fine", "hang", "exit", "hard_exit", "raise", "type", "length", "nan", "string", "huge"]
HTTP_MODES = ["fine", "trickle", "hang", "huge", "status", "garbage", "short", "nan"]


@pytest.mark.slow
def test_fuzz_misbehaving_rewards_end_with_a_reward_error(chaos_server, no_worker_left):
    """Whatever the reward does, each call ends within the deadline (plus a margin) with the scores
    or a RewardError that names the source and the batch; one Python reward serves every example (a
    killed worker is replaced), at most its one worker runs, and none is left once it is closed."""
    before = _children()
    with reward(f"{REWARDS}:chaos", timeout_s=1.5) as python:

        @settings(max_examples=24, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(kind=st.sampled_from(["python", "http"]), py=st.sampled_from(PY_MODES),
               web=st.sampled_from(HTTP_MODES), n=st.integers(1, 6), batch=st.integers(0, 99))
        def one_call(kind, py, web, n, batch):
            r = python if kind == "python" else reward(chaos_server, timeout_s=1.5, retries=1, batch_size=4)
            mode = py if kind == "python" else web
            started = time.monotonic()
            try:
                got = _bounded(lambda: r(["p"] * n, ["c"] * n, {"mode": [mode] * n}, batch=batch), 1.5 + MARGIN_S)
            except RewardError as e:
                assert str(e).startswith(f"reward {r.source!r} on batch {batch}: ") and "\n" not in str(e)
                assert mode != "fine", e
            else:
                assert mode == "fine" and got == [0.0 if kind == "python" else 0.5] * n
            assert time.monotonic() - started < 1.5 + MARGIN_S  # HTTP retries count against the one deadline
            assert len(_children() - before) <= 1  # at most the Python reward's one worker

        one_call()


# ----------------------------------------------------------------------------- through forge run
SCORE = """
import os, pathlib, time
HERE = pathlib.Path(__file__).parent

def score(prompts, completions, **fields):
    calls = HERE / "calls"
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    if (HERE / "hang").exists() and n == 3:
        (HERE / "hanging").write_text(str(os.getpid()))
        time.sleep(10**6)
    return [float(len(c) % 2) for c in completions]
"""


def _rft_recipe(tmp_path: Path, timeout_s: float) -> Path:
    (tmp_path / "score.py").write_text(textwrap.dedent(SCORE))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(16)))
    stage = {"name": "rl", "kind": "rft", "data": ["p"], "max_steps": 4, "batch_size": 2, "group": 2, "seq_len": 64,
             "max_new_tokens": 4, "checkpoint": {"every": 2}, "log_every": 1,
             "rewards": [{"source": "score.py:score", "timeout_s": timeout_s}]}
    recipe = base_recipe(tmp_path, stages=[stage], tracking={"register_model": False}, eval={"domain": [], "general": []})
    recipe["data"]["p"] = {"path": str(prompts), "holdout": 0.0}
    return write_recipe(tmp_path / "r.yaml", recipe)


def _forge(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "forge.cli", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    """The run's output once it has ended; its process group is killed if it outlives `timeout`."""
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _statuses(out: Path) -> dict[str, str]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    return {r.info.run_id: r.info.status for r in mlflow.search_runs(experiment_names=["tiny"], output_format="list")}


@pytest.mark.slow
def test_forge_run_with_a_hanging_reward_fails_its_runs_then_resumes(tmp_path):
    recipe = _rft_recipe(tmp_path, timeout_s=3.0)
    (tmp_path / "hang").write_text("")
    proc = _forge("run", str(recipe))
    output = _finish(proc, 600)
    assert proc.returncode not in (0, None), output
    errors = [line for line in output.splitlines() if "score.py:score' on batch" in line]
    assert len(errors) == 1 and "score.py:score' on batch 3: no answer within 3s (timeout_s)" in errors[0], output[-3000:]
    assert "Traceback" not in output
    assert set(_statuses(tmp_path / "out").values()) == {"FAILED"}
    (tmp_path / "hang").unlink()
    assert cli.main(["run", str(recipe), "--resume"]) == 0  # in this process: a second interpreter's start saved
    assert set(_statuses(tmp_path / "out").values()) == {"FINISHED"}
    import mlflow

    tags = [r.data.tags.get("resumed_from", "") for r in mlflow.search_runs(experiment_names=["tiny"], output_format="list")]
    assert any(t.endswith("step-0000002") for t in tags), tags  # continued from the last checkpoint
    assert (tmp_path / "out" / "novella" / "model.safetensors").is_file()


@pytest.mark.slow
def test_sigterm_while_a_reward_hangs_ends_forge_promptly(tmp_path):
    recipe = _rft_recipe(tmp_path, timeout_s=600.0)
    (tmp_path / "hang").write_text("")
    proc = _forge("run", str(recipe))
    end = time.monotonic() + 600
    while not (tmp_path / "hanging").exists():
        assert proc.poll() is None and time.monotonic() < end, proc.stdout.read()[-3000:] if proc.stdout else ""
        time.sleep(0.2)
    worker = int((tmp_path / "hanging").read_text())
    proc.send_signal(signal.SIGTERM)
    output = _finish(proc, 60)  # the reward's timeout_s is 600 s
    assert proc.returncode != 0, output
    assert "score.py:score' on batch 3: stopped by SIGTERM while the reward was running" in output, output[-3000:]
    assert "Traceback" not in output
    assert set(_statuses(tmp_path / "out").values()) == {"KILLED"}  # stopped on request, not left RUNNING
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE


# ----------------------------------------------------------------------------- scores and answers out of range
HUGE = """
def huge(prompts, completions, **fields):
    return [10**400 for _ in completions]


def huger(prompts, completions, **fields):
    return [10**5000 for _ in completions]
"""


def test_a_score_too_large_for_a_float_is_one_line_naming_the_reward(tmp_path, no_worker_left):
    with pytest.raises(RewardError, match=r"^w: score 0 is a 401-digit integer, too large for a float: not a finite number$"):
        check_scores([10**400], 1, "w")
    (tmp_path / "big.py").write_text(HUGE)
    with reward(f"{tmp_path / 'big.py'}:huge") as r:
        with pytest.raises(RewardError, match=r"reward '.*big.py:huge' on batch 3: score 0 is a 401-digit integer"):
            r(["p"], ["a"], {}, batch=3)
    with reward(f"{tmp_path / 'big.py'}:huger") as r:  # past what JSON carries: the worker says so
        with pytest.raises(RewardError, match=r"on batch 5: its answer cannot be sent back as JSON: Exceeds the limit"):
            r(["p"], ["a"], {}, batch=5)
        with pytest.raises(RewardError, match=r"on batch 6: its answer cannot be sent back as JSON"):
            r(["p"], ["a"], {}, batch=6)
    with json_answer(lambda path: (b"[1" + b"0" * 400 + b"]", 200, {})) as url:
        with pytest.raises(RewardError, match=rf"reward '{url}' on batch 4: score 0 is a 401-digit integer"):
            reward(url, retries=0)(["p"], ["a"], {}, batch=4)


def test_a_redirect_from_a_reward_endpoint_is_said_and_not_followed(no_worker_left):
    with json_answer(lambda path: (b"", 302, {"Location": "https://login.example.com/sso?next=/score"})) as url:
        with pytest.raises(RewardError) as info:
            reward(url, retries=2)(["p"], ["a"], {}, batch=1)
    msg = str(info.value)
    assert "HTTP 302" in msg and "redirect" in msg and "https://login.example.com/sso?next=/score" in msg, msg
    assert "does not follow redirects" in msg and "Expecting value" not in msg and "1 attempt(s)" in msg, msg


@contextlib.contextmanager
def json_answer(answer):
    """A server on 127.0.0.1 answering each POST with `answer(path)`: (body, status, headers)."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body, status, headers = answer(self.path)
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/score"
    finally:
        srv.shutdown()
        srv.server_close()
