"""A real OpenAI-compatible chat server on 127.0.0.1 for the judge tests, answering by a fixed rule:
a response scores 1 + (the times it says "good", at most 4); a response holding "GARBLE" gets an
answer with no score. It counts the chat requests it served."""
from __future__ import annotations

import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


def rule(response: str) -> int:
    return 1 + min(4, response.lower().count("good"))


def answer(text: str) -> str:
    """The grader's reply to a judge prompt built from forge's rubric frames."""
    if "Response 1:" in text:  # a group: "Response N:\n<text>" blocks, then the instructions
        blocks = re.findall(r"Response (\d+):\n(.*?)(?=\n\nResponse \d+:\n|\n\nRate each)", text, re.S)
        if any("GARBLE" in body for _, body in blocks):
            return "These are all fine, I suppose."
        return "\n".join(f"Response {n}: {rule(body)}" for n, body in blocks)
    body = text.split("Response:\n", 1)[1].rsplit("\n\nRate the response", 1)[0]
    return "Hmm, hard to say." if "GARBLE" in body else f"Score: {rule(body)}"


@contextlib.contextmanager
def judge_server() -> Iterator[dict]:
    """Yields {"url": base URL ending in /v1, "requests": [request bodies]}."""
    state: dict = {"requests": []}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._send({"object": "list", "data": [{"id": "rule-judge", "object": "model"}]})
            else:
                self.send_error(404)

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append(body)
            reply = answer(body["messages"][-1]["content"])
            self._send({"id": "x", "object": "chat.completion", "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": reply}}]})

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        state["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
