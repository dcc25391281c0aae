"""Where a Gym server's tool call spends gymhost's microseconds, layer by layer (make bench-layers).

The app ``create_app`` builds for nemo-gym 0.7.0's example_single_tool_call, driven in this one process with ASGI
messages (no sockets, no server: only the app's own work is timed), one seeded episode's ``POST /get_weather`` after
another. Its middleware is rebuilt four ways: none at all (Gym's app alone), each layer of gymhost's stack alone on
top of that, the whole stack without each layer in turn, and as many layers that only pass the call on (what the
plumbing of that many layers costs, whatever they do); a layer's cost is given both ways, what it adds alone and
what taking it out saves. Each layer is also timed alone in front of an app that answers at once: its own work,
hot, where in Gym's app the rest of the request's code competes with it for the processor's caches. Beside them,
the same call on ``fastapi_app.py``'s plain FastAPI route (FastAPI's floor), the measure of the target: gymhost's
layers together at most a tenth of that route's cost. Each figure is the fastest of several rounds of a few
thousand calls (the machine's noise only ever adds time), with the garbage collector paused during a round. Writes
results/<date>-layers.json and the README's layers block (a full `make bench` runs it too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import run
from fastapi_app import app as fastapi_route
from starlette.middleware import Middleware

BODY = b'{"city": "Paris"}'


class PassThrough:
    """A layer that does nothing but pass the call on, seeing each message of the answer go by as every layer that
    reads or changes the response must: a stack of these costs what the layering itself does."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def passed(message: dict[str, Any]) -> None:
            await send(message)

        await self.app(scope, receive, passed)


def scope(path: str, body: bytes, cookie: bytes | None) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if cookie:
        headers.append((b"cookie", cookie))
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip


async def call(app: Any, path: str, body: bytes, cookie: bytes | None = None) -> list[dict[str, Any]]:
    """One request as a server makes it: the body in one message, then a receive that waits (no disconnect)."""
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope(path, body, cookie), receive, send)
    return sent


async def answer_at_once(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that reads the body and answers ``{}``: what a layer costs with nothing behind it."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


def build(folder: Path, keep: Sequence[str]) -> Any:
    from gymhost import create_app

    app = create_app(folder)
    app.user_middleware[:] = [layer for layer in app.user_middleware if _name(layer) in keep]
    return app


def _name(layer: Any) -> str:
    return str(layer.cls.__name__)


def measure(calls: int, rounds: int) -> dict[str, Any]:
    folder = run.gym_root() / run.EXAMPLE
    with contextlib.chdir(folder):  # as `gymhost serve` runs a server: in its folder
        measured = asyncio.run(_measure(folder, calls, rounds))
    return {"calls": calls, "rounds": rounds, **measured}


async def _measure(folder: Path, calls: int, rounds: int) -> dict[str, Any]:
    from gymhost import create_app

    stack = [_name(layer) for layer in create_app(folder).user_middleware]
    configs: dict[tuple[str, str], list[str]] = {("none", ""): [], ("all", ""): stack}
    configs |= {("alone", name): [name] for name in stack}
    configs |= {("all_but", name): [other for other in stack if other != name] for name in stack}
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    configs[("plumbing", "")] = []
    apps: dict[tuple[str, str], tuple[Any, bytes | None]] = {}
    for name, keep in configs.items():
        app = build(folder, keep)
        if name == ("plumbing", ""):
            app.user_middleware[:] = [Middleware(PassThrough) for _ in stack]
        seeded = await call(app, "/seed_session", json.dumps(row).encode())
        cookies = [value for key, value in seeded[0]["headers"] if key == b"set-cookie"]
        apps[name] = (app, cookies[0].split(b";")[0] if cookies else None)
    apps[("floor", "")] = (fastapi_route, None)
    # Each layer alone in front of an app that answers at once: its own work, with nothing else in the caches.
    cookie = apps[("all", "")][1]  # signed by this process's secret, which every session layer made here shares
    apps[("nothing", "")] = (answer_at_once, cookie)
    for layer in build(folder, stack).user_middleware:
        apps[("on_nothing", _name(layer))] = (layer.cls(answer_at_once, *layer.args, **layer.kwargs), cookie)
    fastest: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for name, (app, cookie) in apps.items():
            gc.collect()
            gc.disable()
            started = time.perf_counter()
            for _ in range(calls):
                answer = await call(app, "/get_weather", BODY, cookie)
            elapsed = (time.perf_counter() - started) / calls * 1e6
            gc.enable()
            assert answer[0]["status"] == 200, (name, answer)
            for key, value in answer[0]["headers"]:  # the steady state: the cookie that came in goes back
                assert key != b"set-cookie" or value.startswith(cookie or b"-"), (name, value)
            fastest[name] = min(fastest.get(name, elapsed), elapsed)
    us: dict[str, Any] = {"alone": {}, "all_but": {}, "on_nothing": {}}
    for (kind, name), value in fastest.items():
        if name:
            us[kind][name] = round(value, 1)
        else:
            us[kind] = round(value, 1)
    return {"stack": stack, "us_per_call": us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    given = parser.parse_args()
    run.write_section("layers", lambda: measure(given.calls, given.rounds))


if __name__ == "__main__":
    main()
