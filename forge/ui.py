"""`forge ui`: the MLflow UI on the store a run used, opened on its experiment in the model-training view.

Starts `mlflow server` (its own process group) on a recipe's store, an output folder's SQLite store
or any tracking URI (a team's PostgreSQL database, say), waits until `/health` answers, prints the
URL, and on Ctrl+C, SIGTERM or SIGHUP stops the server and everything it started and removes its
temporary log (kept, and named, when the server itself failed). The server runs under a small
watchdog (`watch`, its process group's leader), which ends the group when forge ui goes however it
goes (killed: a parent-death signal on Linux, and everywhere the end of a pipe forge ui held).

    forge ui recipes/quickstart.yaml
    forge ui --output runs/quickstart --port 5050
    forge ui --tracking-uri postgresql://mlflow@db.internal/mlflow --artifacts s3://bucket/mlflow
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import webbrowser
from pathlib import Path

from forge.errors import ForgeError
from forge.progress import phase
from forge.rundir import RunLayout
from forge.track import view
from forge.track.store import check_store_uri

DEFAULT_PORT = 5050  # not 5000: macOS gives that to AirPlay
MODEL_TRAINING = view.MODEL_TRAINING  # MLflow 3 opens experiments in its GenAI layout otherwise
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2) options (Linux)


def add_arguments(p) -> None:
    p.add_argument("recipe", nargs="?", help="a recipe: open the store it tracks to")
    p.add_argument("--output", metavar="DIR", help="a run's output folder (its mlflow.db)")
    p.add_argument("--tracking-uri", metavar="URI", help="any MLflow store, e.g. postgresql://user@host/db")
    p.add_argument("--artifacts", metavar="URI", help="where the server keeps artifacts of new experiments "
                   "(default: mlartifacts beside a SQLite store, else ./mlartifacts)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only); 0.0.0.0 shares it")
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default 1: one viewer)")
    p.add_argument("--open", action="store_true", help="open the URL in a browser, when one is available")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the server to answer")


def resolve_store(args) -> tuple[str, str | None, str | None]:
    """(tracking URI, experiment name or None, artifacts destination or None) from the arguments."""
    given = [a for a in (args.recipe, args.output, args.tracking_uri) if a]
    if len(given) != 1:
        raise ForgeError("forge ui: give exactly one of RECIPE, --output DIR or --tracking-uri URI")
    experiment = None
    if args.recipe:
        from forge.recipe import load_recipe

        recipe = load_recipe(args.recipe, [])
        uri, experiment = recipe.tracking_uri, recipe.experiment
    elif args.output:
        uri = f"sqlite:///{RunLayout(Path(args.output)).mlflow_db.resolve()}"
    else:
        uri = args.tracking_uri
    check_store_uri(uri)
    artifacts = args.artifacts
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise ForgeError(f"no MLflow store at {db}: run the recipe first (forge run RECIPE), "
                             "or point at another with --output DIR / --tracking-uri URI")
        with db.open("rb") as f:
            if f.read(16) not in (b"SQLite format 3\x00", b""):
                raise ForgeError(f"{db} is not an SQLite database (so not an MLflow store); point "
                                 "--tracking-uri / --output at the store a forge run wrote")
        artifacts = artifacts or str(db.parent / "mlartifacts")
    return uri, experiment, artifacts


def check_port(host: str, port: int) -> None:
    """A port the server can listen on: in range (not 0, which the OS would pick) and free."""
    if not 1 <= port <= 65535:
        raise ForgeError(f"--port {port}: expected a port number from 1 to 65535")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ForgeError(f"port {port} on {host} is in use ({e.strerror}): pick another with --port") from None


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (our own local server)
        return r.read()


def wait_healthy(base: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            raise ForgeError(f"mlflow server stopped (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")
        try:
            if _get(f"{base}/health", timeout=2.0).strip() == b"OK":
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise ForgeError(f"mlflow server did not answer {base}/health within {timeout:.0f} s (log: {log})")


def experiment_url(base: str, name: str | None) -> str:
    """The experiment's runs in the model-training layout, in forge's view when a pipeline wrote it
    (forge.track.view): the named experiment, else the store's most recently updated one (an output
    folder holds one); the experiments list when there is none."""
    try:
        if name:
            query = urllib.parse.urlencode({"experiment_name": name})
            found = [json.loads(_get(f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?{query}", 30))["experiment"]]
        else:
            query = urllib.parse.urlencode({"max_results": 50, "order_by": "last_update_time DESC"})
            found = json.loads(_get(f"{base}/ajax-api/2.0/mlflow/experiments/search?{query}", 30)).get("experiments", [])
            found = [e for e in found if e["name"] != "Default"]
        if found:
            tags = {t.get("key") for t in found[0].get("tags", [])}
            return view.experiment_url(base, found[0]["experiment_id"], view=view.VIEW_TAG in tags)
    except (OSError, KeyError, ValueError, AttributeError):
        pass  # an older server or an empty store: the list still opens in the right layout
    return view.experiment_url(base)


def _die_with_parent() -> None:
    """In the watchdog between fork and exec (Linux): SIGTERM to it when forge ui ends, however."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog still sees the pipe from forge ui close


def start(uri: str, host: str, port: int, artifacts: str | None, workers: int, log: Path,
          lifeline: int) -> subprocess.Popen:
    """`mlflow server` under its watchdog (`watch`, given the read end `lifeline` of a pipe forge ui
    holds open), in a session of their own: Ctrl+C reaches forge only, `stop()` ends the whole
    group, and the watchdog ends it when forge ui goes."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host,
           "--port", str(port), "--workers", str(workers)]
    if artifacts:
        cmd += ["--artifacts-destination", artifacts]
    env = {**os.environ, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    # a viewer runs no server-side jobs (MLflow 3 otherwise starts a job runner and its worker
    # processes beside the server); the user's own setting wins
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    watchdog = [sys.executable, "-m", "forge.ui", "--watch", str(lifeline), str(log.parent), "--", *cmd]
    with open(log, "wb") as out:
        return subprocess.Popen(watchdog, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, pass_fds=(lifeline,),
                                preexec_fn=_die_with_parent)


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """End the server and every process it started (its process group)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; workers of the group may still be ending
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _stop_on(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM and SIGHUP (a closed terminal) stop the UI as Ctrl+C does


def run(args) -> int:
    uri, experiment, artifacts = resolve_store(args)
    if uri.startswith(("http://", "https://")):
        print(f"{uri} is already a tracking server: open {experiment_url(uri.rstrip('/'), experiment)}")
        return 0
    check_port(args.host, args.port)
    base = f"http://{args.host if ':' not in args.host else f'[{args.host}]'}:{args.port}"
    log = Path(tempfile.mkdtemp(prefix="forge-ui-")) / "mlflow-server.log"
    previous = {sig: signal.signal(sig, _stop_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
    failed = False  # the server's own failure: its log stays for the message that names it
    lifeline, keep = os.pipe()  # forge ui holds `keep` open while it lives (never inherited)
    try:
        try:
            proc = start(uri, args.host, args.port, artifacts, args.workers, log, lifeline)
        finally:
            os.close(lifeline)
        try:
            with phase(f"starting the MLflow server on {base} (half a minute the first time)", done=False):
                wait_healthy(base, proc, log, args.timeout)
            url = experiment_url(base, experiment)
            print(f"MLflow UI on {uri}\n  {url}\n  (Ctrl+C to stop; server log: {log})\n  {view.ASSISTANT_NOTE}",
                  flush=True)
            if args.open:
                webbrowser.open(url)
            proc.wait()
            raise ForgeError(f"mlflow server stopped (exit {proc.returncode}); see {log}")
        except ForgeError:
            failed = True
            raise
        except KeyboardInterrupt:
            print("stopping the MLflow UI", flush=True)
            return 0
        finally:
            stop(proc)
    finally:
        os.close(keep)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not failed:
            shutil.rmtree(log.parent, ignore_errors=True)


# ------------------------------------------------------------------ the watchdog (its own process)
def _ask_stop(asked: list[int]):
    return lambda signum, frame: asked.append(signum)


def _become_subreaper() -> bool:
    """Linux: orphaned descendants (the server's workers, once it is gone) become ours to wait for."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_all(server: subprocess.Popen, subreaper: bool, deadline: float) -> bool:
    """Wait until every descendant has ended (a subreaper has no child left), else only the server;
    whether that happened by the deadline."""
    while time.monotonic() < deadline:
        if not subreaper:
            if server.poll() is not None:
                return False  # its workers cannot be seen from here: the group is swept anyway
        else:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                return True
        time.sleep(0.1)
    return False


def watch(argv: list[str], grace: float = 10.0) -> int:
    """`python -m forge.ui --watch FD LOGDIR -- CMD...`: the leader of the server's process group.
    Runs CMD; when forge ui goes (the pipe FD reads end-of-file, or the parent-death signal) or asks
    (SIGTERM, SIGHUP), or the server ends, ends the whole group (SIGTERM, SIGKILL after `grace`
    seconds). LOGDIR is removed when forge ui is gone (else forge ui decides)."""
    lifeline, logdir, cmd = int(argv[0]), Path(argv[1]), argv[3:]
    parent, asked = os.getppid(), list[int]()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a session of its own: never from a terminal
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _ask_stop(asked))
    orphaned = threading.Event()

    def _watch_parent() -> None:
        while os.read(lifeline, 512):
            pass
        orphaned.set()  # every copy of the write end is closed: forge ui has exited

    threading.Thread(target=_watch_parent, daemon=True).start()
    subreaper = _become_subreaper()
    server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)  # same group; output: the log
    while not asked and not orphaned.is_set() and server.poll() is None:
        time.sleep(0.2)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what it sends the group is not for itself
    try:
        os.killpg(0, signal.SIGTERM)
    except ProcessLookupError:
        pass
    done = _reap_all(server, subreaper, time.monotonic() + grace)
    if orphaned.is_set() or os.getppid() != parent:
        shutil.rmtree(logdir, ignore_errors=True)
    if not done:
        os.killpg(0, signal.SIGKILL)  # what is left of the group, this watchdog with it
    return server.returncode if server.returncode is not None else 1


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    sys.exit(watch(sys.argv[2:]))
