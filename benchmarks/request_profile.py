"""Where a Gym server's tool call spends its CPU under load, piece by piece (make bench-request-profile).

``layers.py`` times each of gymhost's layers in one process with ASGI messages; this is the same question asked of
real servers under wrk, as issue 31 asks it (py-spy under wrk). Three servers of nemo-gym 0.7.0's
example_single_tool_call, up at once: `gymhost serve`, Gym's app with no middleware at all (`gym_app_bare.py`) and
a plain FastAPI route with the same models (`fastapi_app.py`). Each in turn takes wrk's one tool call of a seeded
episode at 64 connections while py-spy samples it from outside (``--nonblocking``: the server is never paused), and
its CPU over the same seconds is read from `/proc`.

Each sample goes to the piece that was running: walking its stack from the innermost frame out, the first frame in
code that belongs to a piece (a gymhost layer, by the file its class is in; the rest of gymhost; Gym's app; the
framework: FastAPI, Starlette, pydantic; the server and its event loop). Frames in helper libraries (json,
prometheus_client, anyio, itsdangerous, the standard library) count for whoever called them. A piece's share of the
samples times the CPU a call gives its microseconds a call. Writes results/<date>-request-profile.json and the
README's request-profile block.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import inspect
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import run

HERE = Path(__file__).resolve().parent
CONNECTIONS = 64
GYMHOST = "`gymhost serve`"
GYM_ALONE = "Gym's app, no middleware"
FLOOR = "plain FastAPI route (FastAPI's floor)"

# Pieces that are not one of gymhost's layers, each by the start of its frames' file paths as py-spy prints them.
GYMHOST_OTHER = "gymhost, outside its layers (the lifespan's wrapper, the tool routes' order)"
APP = "the app's own code (Gym's handlers, models and routes; the floor's one route)"
FRAMEWORK = "FastAPI, Starlette and pydantic"
SERVER = "uvicorn, httptools and the event loop"
OTHER = "anything else (a sample with no frame of these, such as the collector's)"
PIECES = {
    # (py-spy prints a Gym server's own module as ``app.py``: the server runs in its folder, which is on sys.path)
    APP: ("nemo_gym/", "resources_servers/", "app.py", "fastapi_app.py"),
    FRAMEWORK: ("fastapi/", "starlette/", "pydantic/", "pydantic_core/"),
    SERVER: ("uvicorn/", "httptools/", "uvloop/", "asyncio/", "<frozen runpy>", "click/"),
}
# gymhost's helpers that a layer calls (counted for the layer), as are helper libraries: anything not a piece.
GYMHOST_HELPERS = (
    "gymhost/_asgi.py",
    "gymhost/_keys.py",
    "gymhost/_sessions/_identity.py",
    "gymhost/_sessions/_owner.py",
)


def layer_files(folder: Path) -> dict[str, str]:
    """Each of gymhost's layers on this folder's app, by the file its class is defined in (as py-spy prints it:
    from ``gymhost/`` on), so that the attribution follows the code wherever a layer moves."""
    from gymhost import create_app

    files = {}
    for layer in create_app(folder).user_middleware:
        source = Path(inspect.getfile(layer.cls)).as_posix()
        files["gymhost/" + source.split("/gymhost/", 1)[1]] = layer.cls.__name__
    return files


def piece_of(stack: list[str], layers: dict[str, str]) -> str:
    """The piece a sample belongs to: its innermost frame that is in one (``stack``: outermost frame first)."""
    for frame in reversed(stack):
        path = frame.rsplit(" (", 1)[-1].rsplit(":", 1)[0]
        if path in layers:
            return layers[path]
        if path.startswith("gymhost/"):
            if path not in GYMHOST_HELPERS:
                return GYMHOST_OTHER
            continue
        for piece, starts in PIECES.items():
            if path.startswith(starts):
                return piece
    return OTHER


def attribute(raw: str, layers: dict[str, str]) -> collections.Counter[str]:
    """py-spy's raw output (a line a distinct stack: frames separated by ``;``, then the count) counted by piece."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[piece_of(stack.split(";"), layers)] += int(count)
    return counts


def profile(pid: int, url: str, cookie: str, seconds: int, rate: int) -> dict[str, Any]:
    """wrk on one server while py-spy samples it; its CPU a call and the samples by piece's raw counts."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as output:
        spy = subprocess.Popen(
            [str(Path(run.PYTHON).parent / "py-spy"), "record", "--pid", str(pid), "--rate", str(rate),
             "--duration", str(seconds + 1), "--nonblocking", "--format", "raw", "--output", output.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        before = run.cpu_seconds(pid)
        result = run.wrk(f"{url}/get_weather", CONNECTIONS, seconds, cookie)
        cpu = run.cpu_seconds(pid) - before
        _, errors = spy.communicate(timeout=60)
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {errors.strip()}")
        raw = Path(output.name).read_text()
    return {"rps": result["rps"], "cpu_us_per_request": cpu / (result["rps"] * seconds) * 1e6, "raw": raw}


def measure(rounds: int, seconds: int, rate: int) -> dict[str, Any]:
    folder = run.gym_root() / run.EXAMPLE
    with contextlib.chdir(folder):  # create_app reads the folder as `gymhost serve` does, from inside it
        layers = layer_files(folder)
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    serve = [run.PYTHON, "-m", "gymhost", "serve", str(folder), "--log-level", "warning"]
    servers = {
        GYMHOST: serve,
        GYM_ALONE: [run.PYTHON, str(HERE / "gym_app_bare.py"), str(folder)],
        FLOOR: [run.PYTHON, str(HERE / "fastapi_app.py")],
    }
    counts: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in servers}
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    with contextlib.ExitStack() as stack:
        targets = {}
        for name, command in servers.items():
            port = run.free_port()
            url = f"http://127.0.0.1:{port}"
            argv = [*command, "--port", str(port)] if command is serve else [*command, str(port)]
            process = stack.enter_context(run.server(argv, url))
            cookie = run.seed_cookie(url, row) if command is serve else ""
            run.wrk(f"{url}/get_weather", 16, 1, cookie)  # warm up
            targets[name] = (process.pid, url, cookie)
        for number in range(rounds):
            for name, (pid, url, cookie) in run.in_turn(targets, number):
                measured = profile(pid, url, cookie, seconds, rate)
                counts[name] += attribute(measured["raw"], layers)
                cpu[name].append(measured["cpu_us_per_request"])
    results = {}
    for name in servers:
        total = sum(counts[name].values())
        cpu_us = sorted(cpu[name])[len(cpu[name]) // 2]
        results[name] = {
            "cpu_us_per_request": round(cpu_us, 1),
            "samples": total,
            "us_per_request": {piece: round(n / total * cpu_us, 1) for piece, n in counts[name].most_common()},
        }
    ours = [*layers.values(), GYMHOST_OTHER]
    return {
        "connections": CONNECTIONS, "rounds": rounds, "seconds": seconds, "rate": rate, "servers": results,
        "layers": list(layers.values()), "gymhost_pieces": ours, "pieces": [SERVER, FRAMEWORK, APP, *ours, OTHER],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    given = parser.parse_args()
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": run.machine()}
    record["request_profile"] = measure(given.rounds, given.seconds, given.rate)
    run.write_results(record, record["date"][:10] + "-request-profile")
    print(f"(raw: results/{record['date'][:10]}-request-profile.json)", file=sys.stderr)


if __name__ == "__main__":
    main()
