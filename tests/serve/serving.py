"""Helpers for the `forge serve` tests: the server in a thread of this process (so a test can look
at a served model's weights) or as a `forge serve` child process (so a test can signal it), the
official SDK pointed at it, and chat examples tokenized by forge's own SFT path
(forge.data.examples.sft_examples), so that both sides see the same tokens."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from forge_testing import SHARED

KEY = "tml-forge-serve-test-key-0123456789"
OTHER_KEY = "tml-forge-serve-other-client-key-42"  # another client's key (config(..., api_keys=[KEY, OTHER_KEY]))
MEDQUAD = SHARED / "domain" / "medquad_cancergov" / "cancergov_qa.jsonl"
# used when ../shared/data is absent, so the SDK loop runs on a fresh clone too
PAIRS = [("What is a tumor?", "A tumor is a mass of abnormal cells."),
         ("What does a biopsy do?", "A biopsy removes a small piece of tissue to check it for cancer."),
         ("What is chemotherapy?", "Chemotherapy is treatment with drugs that kill cancer cells."),
         ("What is remission?", "Remission means the signs of cancer are reduced or gone."),
         ("What is a lymph node?", "A lymph node is a small organ that filters lymph fluid.")]


@dataclass
class Server:
    url: str
    app: Any
    thread: threading.Thread

    @property
    def served(self) -> Any:  # forge.serve.app.Served: the registry, the worker
        return self.app.state.served

    def model(self, model_id: str) -> Any:
        """The served model's PEFT model (read between calls: the worker is idle once a future answered)."""
        return self.served.registry.models[model_id].served.session.unwrapped()


def config(base: Path | str, **extra: Any) -> dict[str, Any]:
    return {"models": [{"name": "tiny", "base": str(base)}], "api_keys": [KEY, OTHER_KEY], **extra}


@contextlib.contextmanager
def serving(cfg: dict[str, Any]) -> Iterator[Server]:
    """forge serve's app under uvicorn on 127.0.0.1 (a port the OS picks), in a thread."""
    import uvicorn

    from forge.serve.app import create_app
    from forge.serve.config import ServeConfig, check

    parsed = ServeConfig.model_validate(cfg)
    check(parsed, "test config")
    app = create_app(parsed)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="info"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", app, thread)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@dataclass
class Child:
    url: str
    proc: subprocess.Popen
    log: Path  # its stdout and stderr

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def serving_process(cfg: dict[str, Any], folder: Path, prelude: str = "") -> Iterator[Child]:
    """`forge serve` as a child process on 127.0.0.1 (signals at their defaults), run by a launcher
    script in `folder` that runs `prelude` (a test's patches, Python source) and then forge's own
    command line; killed at the end if it is still running."""
    from servers import ROOT, free_port, kill_tree, poll, spawn

    folder.mkdir(parents=True, exist_ok=True)
    config_file, launcher, log = folder / "serve.yaml", folder / "launch.py", folder / "serve.log"
    config_file.write_text(json.dumps(cfg))  # JSON is YAML
    launcher.write_text(f"{prelude}\nimport sys\nfrom forge.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = spawn([sys.executable, str(launcher), "serve", "--config", str(config_file), "--port", str(port)],
                     cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    try:
        assert poll(lambda: up(url, proc), 120) and proc.poll() is None, f"forge serve did not start:\n{log.read_text()}"
        yield Child(url, proc, log)
    finally:
        if proc.poll() is None:
            kill_tree(proc)


def up(url: str, proc: subprocess.Popen) -> bool:
    """Whether the forge serve child at `url` answers its health check, or has died (stop waiting)."""
    import httpx

    try:
        return httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return proc.poll() is not None


def rows(n: int) -> list[tuple[int, str, dict]]:
    """(record number, where, row) of `n` question/answer chats: MedQuAD's (cancer.gov) when
    ../shared/data is there, else a few built in."""
    pairs = PAIRS
    if MEDQUAD.is_file():
        with open(MEDQUAD) as f:
            pairs = [(r["question"], r["answer"]) for r in map(json.loads, f)]
    chats = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in pairs]
    return [(i, f"chat {i}", chats[i]) for i in range(n)]


def sft_tokens(tokenizer: Any, n: int, seq_len: int) -> list[dict]:
    """forge's SFT examples ({'input_ids', 'labels'}: labels on the answer) of `n` chats."""
    from forge.data.examples import sft_examples
    from forge.data.formats import FormatSpec, FormatStats

    spec = FormatSpec("messages", too_long="truncate")
    out = list(sft_examples(rows(n), tokenizer, spec, seq_len, "chats", FormatStats()))
    assert len(out) == n
    return out


def short_datum() -> Any:
    """Four tokens and their next tokens, for a test that needs a step, not a figure."""
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9, 17]),
                       loss_fn_inputs={"target_tokens": [5, 9, 17, 2]})


def datum(example: dict, scale: float = 1.0) -> Any:
    """The SDK's Datum of a forge SFT example: input tokens[:-1], targets tokens[1:], weight `scale`
    where forge's labels carry loss (the answer) and 0 elsewhere."""
    from tinker import types

    from forge.train.losses import IGNORE

    ids, labels = example["input_ids"], example["labels"]
    weights = [scale if lab != IGNORE else 0.0 for lab in labels[1:]]
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": list(ids[1:]), "weights": weights})


def labelled(examples: list[dict]) -> int:
    from forge.train.losses import IGNORE

    return sum(sum(lab != IGNORE for lab in ex["labels"][1:]) for ex in examples)


def trainable(model: Any) -> dict[str, Any]:
    """A model's trainable tensors (the LoRA adapters), copied."""
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def max_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)
