"""Serve the Tinker API to the official Tinker SDK: LoRA training of the config's base models
(forward_backward with cross_entropy, importance_sampling or ppo, optim_step with AdamW: each step
forge's own), sampling, and checkpoints that forge eval and forge export read.

    forge serve --config serve.yaml [--host 127.0.0.1] [--port 8000]

Clients: ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-...") (or TINKER_BASE_URL and
TINKER_API_KEY). What is served and what is not: docs/SERVE.md.
"""
from __future__ import annotations

import argparse
import ipaddress
import signal

from forge.progress import say

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="serve.yaml: base models, API keys (see docs/SERVE.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log level (default info: one line per request and per model call)")


def _loopback(host: str) -> bool:
    try:
        return host in LOOPBACK or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from forge.serve.config import load_config

    cfg = load_config(args.config)
    names = ", ".join(m.name for m in cfg.models)
    say(f"forge serve: {len(cfg.models)} base model(s) ({names}) on http://{args.host}:{args.port}")
    if cfg.checkpoint_dir is None and cfg.workdir is None:
        say("forge serve: checkpoints (save_state, save_weights_for_sampler) go to a temporary folder removed when "
            "the server stops; set checkpoint_dir in the config to keep them")
    if not _loopback(args.host):
        say(f"forge serve: listening on {args.host}, beyond this machine: requests still need an API key, but the "
            "traffic is plain HTTP (put TLS in front)")
    import logging

    import uvicorn

    from forge.serve.app import create_app

    handler = logging.StreamHandler()  # the model calls' lines, beside uvicorn's request lines
    handler.setFormatter(logging.Formatter("%(levelname)s:     forge serve: %(message)s"))
    logging.getLogger("forge.serve").addHandler(handler)
    logging.getLogger("forge.serve").setLevel(args.log_level.upper())
    # SIGTERM stops the server as Ctrl+C does: uvicorn takes either signal, stops taking requests and
    # lets the app shut down (the worker finishes the calls queued, a save under way among them);
    # it then raises the signal again, which here ends the process by KeyboardInterrupt (exit 0,
    # as Ctrl+C) rather than by the signal's default action
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        # a client's long poll must not hold Ctrl+C for its 20 s
        uvicorn.run(create_app(cfg), host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=5)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
