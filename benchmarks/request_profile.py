"""Where a Gym server's tool call spends its CPU under load, piece by piece (make bench-request-profile).

``layers.py`` times each of gymhost's layers in one process with ASGI messages; this is the same question asked of
real servers under wrk, as issue 31 asks it (py-spy under wrk). Three servers of nemo-gym 0.7.0's
example_single_tool_call, up at once: `gymhost serve`, Gym's app with no middleware at all (`gym_app_bare.py`) and
a plain FastAPI route with the same models (`fastapi_app.py`). Each in turn takes wrk's one tool call of a seeded
episode at 64 connections while py-spy samples it from outside (``--nonblocking``: the server is never paused), and
its CPU over the same seconds is read from `/proc`.

Each sample goes to the piece whose code was running, walking its stack from the innermost frame out:

- a frame of one of gymhost's layers (by the module its class is in) is that layer's;
- a frame of the rest of gymhost counts for the layer that called it, and is gymhost's outside its layers when
  something else called it (uvicorn calling the lifespan's wrapper);
- a frame of Gym's app, of the framework (FastAPI, Starlette, pydantic, even when a layer calls it) or of the server
  (uvicorn, httptools, the event loop's own modules) is that piece's;
- a frame of any other library (json, prometheus_client, anyio, itsdangerous, the rest of the standard library)
  counts for whoever called it.

A piece's share of the samples times the server's CPU a call is its microseconds a call. Writes
results/<date>-request-profile.json and the README's request-profile block.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# (`run` and `request_path` are imported where they are used: they need the benchmarks' venv, and the attribution
# is tested without it.)

HERE = Path(__file__).resolve().parent
CONNECTIONS = 64
GYMHOST = "`gymhost serve`"
GYM_ALONE = "Gym's app, no middleware"
FLOOR = "plain FastAPI route (FastAPI's floor)"
PY_SPY = Path(sys.executable).parent / "py-spy"

# The pieces other than gymhost's, each by the start of its frames' file paths as py-spy prints them (from the
# outermost folder with no ``__init__.py``: a Gym server's own module is ``app.py``).
GYMHOST_OTHER = "gymhost, outside its layers (the lifespan's wrapper, the tool routes' order)"
APP = "the app's own code (Gym's handlers, models and routes; the floor's one route)"
FRAMEWORK = "FastAPI, Starlette and pydantic"
SERVER = "uvicorn, httptools and the event loop"
OTHER = "anything else (a sample with no frame of these, or none py-spy could read)"
PIECES = {
    APP: ("nemo_gym/", "app.py", "fastapi_app.py"),
    FRAMEWORK: ("fastapi/", "starlette/", "pydantic/", "pydantic_core/"),
    SERVER: ("uvicorn/", "httptools/", "uvloop/", "asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py",
             "<frozen runpy>", "click/"),
}  # fmt: skip
_LINE = re.compile(r":\d+$")


def layer_files(folder: Path) -> dict[str, str]:
    """Each of gymhost's layers on this folder's app, by the file its class is defined in, as py-spy prints it
    (``gymhost/middleware/metrics.py``), so that the attribution follows the code wherever a layer moves."""
    from gymhost import create_app

    files: dict[str, str] = {}
    for layer in create_app(folder).user_middleware:
        module = sys.modules[layer.cls.__module__]
        assert module.__name__.startswith("gymhost."), f"{layer.cls.__name__} is not one of gymhost's layers"
        path = "/".join(module.__name__.split(".")) + ("/__init__.py" if hasattr(module, "__path__") else ".py")
        assert Path(str(module.__file__)).as_posix().endswith("/" + path), (path, module.__file__)
        assert path not in files, f"{layer.cls.__name__} and {files[path]} share {path}: tell them apart by class"
        files[path] = layer.cls.__name__
    return files


def frame_path(frame: str) -> str:
    """The file of one of py-spy's frames, ``function (path:line)``, or ``function (path)`` when it read no line."""
    return _LINE.sub("", frame.rpartition(" (")[2].removesuffix(")"))


def piece_of(stack: list[str], layers: dict[str, str]) -> str:
    """The piece a sample belongs to (``stack``: its frames, outermost first)."""
    called_gymhost = False  # an inner frame was in gymhost outside its layers
    for frame in reversed(stack):
        path = frame_path(frame)
        if path in layers:
            return layers[path]
        if path.startswith("gymhost/"):
            called_gymhost = True
            continue
        for piece, starts in PIECES.items():
            if path.startswith(starts):
                return GYMHOST_OTHER if called_gymhost else piece
    return GYMHOST_OTHER if called_gymhost else OTHER


def attribute(raw: str, layers: dict[str, str]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """py-spy's raw output (a line a distinct stack: its frames separated by ``;``, then the count) counted by
    piece; and the samples of no piece by their innermost frames, to look at."""
    counts: collections.Counter[str] = collections.Counter()
    unplaced: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [frame for frame in stack.split(";") if frame.strip()]
        piece = piece_of(frames, layers)
        counts[piece] += int(count)
        if piece == OTHER:
            unplaced[" < ".join(reversed(frames[-3:])) or "(no Python frame)"] += int(count)
    return counts, unplaced


def profile(pid: int, url: str, cookie: str, seconds: int, rate: int) -> dict[str, Any]:
    """wrk on one server while py-spy samples it: throughput, the server's CPU a call, py-spy's raw output and the
    samples it could not take."""
    import run

    with tempfile.NamedTemporaryFile(suffix=".txt") as output:
        spy = subprocess.Popen(
            [str(PY_SPY), "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(seconds + 1),
             "--nonblocking", "--format", "raw", "--output", output.name],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            before = run.cpu_seconds(pid)
            result = run.wrk(f"{url}/get_weather", CONNECTIONS, seconds, cookie)
            cpu = run.cpu_seconds(pid) - before
            said, _ = spy.communicate(timeout=60)
        finally:
            spy.kill()
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {said.strip()}")
        raw = Path(output.name).read_text()
    if result["rps"] <= 0 or result["errors"] or result["socket_errors"]:
        raise RuntimeError(f"{url}: wrk's tool calls did not all succeed: {result}")
    errors = re.search(r"Errors: (\d+)", said)
    return {
        "rps": result["rps"],
        "cpu_us_per_request": cpu / (result["rps"] * seconds) * 1e6,
        "raw": raw,
        "spy_errors": int(errors.group(1)) if errors else 0,
    }


def check_py_spy() -> None:
    """py-spy is there and may read another process's memory (root, or ptrace allowed): checked before a full
    run's sections, which only write their results at the end."""
    if not PY_SPY.exists():
        raise SystemExit(f"bench: {PY_SPY} is missing (pip install py-spy); `make bench` installs it")
    waiting = "print('up', flush=True); import time; time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", waiting], stdout=subprocess.PIPE, text=True) as child:
        try:
            if child.stdout is None or child.stdout.readline() != "up\n":  # up: an interpreter py-spy can read
                raise SystemExit("bench: a Python process for py-spy to read did not start")
            dumped = subprocess.run([str(PY_SPY), "dump", "--pid", str(child.pid)], capture_output=True, text=True)
        finally:
            child.kill()
    if dumped.returncode != 0:
        raise SystemExit(f"bench: py-spy cannot read another process here ({dumped.stderr.strip()[:200]})")


def measure(rounds: int, seconds: int, rate: int) -> dict[str, Any]:
    import request_path
    import run

    if rounds < 1:
        raise ValueError("at least one round")
    folder = run.gym_root() / run.EXAMPLE
    with contextlib.chdir(folder):  # create_app reads the folder as `gymhost serve` does, from inside it
        layers = layer_files(folder)
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    serve = [run.PYTHON, "-m", "gymhost", "serve", str(folder), "--log-level", "warning"]
    servers: dict[str, tuple[list[str], dict[str, str]]] = {
        GYMHOST: (serve, {}),
        GYM_ALONE: ([run.PYTHON, str(HERE / "gym_app_bare.py"), str(folder)], {}),
        FLOOR: ([run.PYTHON, str(HERE / "fastapi_app.py")], {}),
    }
    counts: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in servers}
    unplaced: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in servers}
    rounds_seen: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    with contextlib.ExitStack() as stack:
        targets = request_path.start_servers(stack, servers, serve, row)
        for number in range(rounds):
            for name, (url, cookie, pid) in run.in_turn(targets, number):
                measured = profile(pid, url, cookie, seconds, rate)
                placed, missed = attribute(measured.pop("raw"), layers)
                counts[name] += placed
                unplaced[name] += missed
                rounds_seen[name].append({key: round(value, 1) for key, value in measured.items()})
    results = {}
    for name in servers:
        total = sum(counts[name].values())
        if total == 0:
            raise RuntimeError(f"py-spy took no sample of {name}")
        cpu_us = statistics.median_low(r["cpu_us_per_request"] for r in rounds_seen[name])
        results[name] = {
            "cpu_us_per_request": cpu_us,
            "samples": total,
            "us_per_request": {piece: round(n / total * cpu_us, 1) for piece, n in counts[name].most_common()},
            "rounds": rounds_seen[name],
            "unplaced": dict(unplaced[name].most_common(5)),
        }
    ours = [*layers.values(), GYMHOST_OTHER]
    return {
        "connections": CONNECTIONS, "rounds": rounds, "seconds": seconds, "rate": rate, "servers": results,
        "layers": list(layers.values()), "gymhost_pieces": ours, "pieces": [SERVER, FRAMEWORK, APP, *ours, OTHER],
    }  # fmt: skip


def main() -> None:
    import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    given = parser.parse_args()
    check_py_spy()
    run.write_section("request_profile", lambda: measure(given.rounds, given.seconds, given.rate))


if __name__ == "__main__":
    main()
