"""A scripted OpenAI-compatible model server for tests that run a real trainer client: no model, a fixed play.

Chat completions only (streamed or not), which is what verifiers' agent program calls. Turn k of a conversation
(k = the assistant messages after the last user message) answers the script's k-th tool call; once the script is
used up, it answers ``final`` as plain text, which ends the client's tool loop. Standard library only, so any
Python runs it: ``python scripted_model.py --port P --script '{"steps": [...], "final": "..."}'``.

Several rows in one run: ``{"scripts": [{"match": TEXT, "steps": ..., "final": ...}, ...]}`` plays the first script
whose ``match`` is in the conversation's first user message. A test that must do something in the middle of an
episode (kill an instance, restart the server) names a gate: ``"gates": {"1": "killed"}`` holds turn 1 until the
file ``GATES/killed.go`` exists, after creating ``GATES/killed.reached`` (``--gates GATES``), so the test acts when the
episode is where it wants it, and the episode goes on when it is done.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCRIPT: dict[str, Any] = {"steps": [], "final": "Done."}
GATES: Path | None = None


def script_of(messages: list[dict[str, Any]]) -> dict[str, Any]:
    if "scripts" not in SCRIPT:
        return SCRIPT
    first = next((str(message.get("content")) for message in messages if message.get("role") == "user"), "")
    for script in SCRIPT["scripts"]:
        if script["match"] in first:
            return dict(script)
    raise LookupError(f"no script matches the prompt {first[:200]!r}")


def wait_at_gate(name: str) -> None:
    assert GATES is not None, "a script names a gate: start the model with --gates FOLDER"
    (GATES / f"{name}.reached").touch()
    while not (GATES / f"{name}.go").exists():
        time.sleep(0.05)


def completion(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages") or []
    last_user = max((i for i, message in enumerate(messages) if message.get("role") == "user"), default=-1)
    turn = sum(1 for message in messages[last_user + 1 :] if message.get("role") == "assistant")
    script = script_of(messages)
    gate = (script.get("gates") or {}).get(str(turn))
    if gate is not None:
        wait_at_gate(gate)
    steps = script.get("steps") or []
    message: dict[str, Any] = {"role": "assistant", "content": None if turn < len(steps) else script.get("final")}
    if turn < len(steps):
        step = steps[turn]
        function = {"name": step["name"], "arguments": json.dumps(step.get("arguments") or {})}
        message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": function}]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if turn < len(steps) else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def chunks(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    full = completion(body)
    base = {"id": full["id"], "created": full["created"], "model": full["model"], "object": "chat.completion.chunk"}
    choice = full["choices"][0]
    message = choice["message"]
    yield base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    if message.get("content"):
        yield base | {"choices": [{"index": 0, "delta": {"content": message["content"]}, "finish_reason": None}]}
    for index, call in enumerate(message.get("tool_calls") or []):
        delta = {"tool_calls": [{"index": index, **call}]}
        yield base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    yield base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    if (body.get("stream_options") or {}).get("include_usage"):
        yield base | {"choices": [], "usage": full["usage"]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "tests"}]})
        else:
            self._json({"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json({"error": {"message": f"no route {self.path}"}}, 404)
        elif not body.get("stream"):
            self._json(completion(body))
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks(body):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    def _json(self, answer: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    global SCRIPT, GATES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", required=True, help='JSON: {"steps": [{"name", "arguments"}], "final": "..."}')
    parser.add_argument("--gates", type=Path, default=None, help="the folder of the scripts' gates")
    args = parser.parse_args()
    SCRIPT = json.loads(args.script)
    GATES = args.gates
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
