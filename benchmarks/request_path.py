"""The request path, before and after a change, side by side (make bench-request-path BASELINE=<git revision>).

One tool call of a seeded episode (`POST /get_weather` on nemo-gym's example_single_tool_call, with the session
cookie) against five servers up at once: `gymhost serve` of the BASELINE revision (a git worktree, imported ahead of
this checkout through PYTHONPATH, in the same venv), of this checkout, and of this checkout with
`--masked-verdicts answer` (which leaves out the masked-verdicts layer, so the pair gives that layer's cost); and the
two floors under them: Gym's app with no middleware at all (`gym_app_bare.py`: what Gym's own app costs) and a plain
FastAPI route with the same models (`fastapi_app.py`: FastAPI's floor). wrk (one thread, keep-alive) at 1, 64 and 256
connections, 4 s a point, rounds interleaved so a machine that slows down slows all of them alike, the order rotated
by one place a round (`run.in_turn`); each point is its median round. CPU per request is the server process's own
(`/proc`), over the same runs. Writes results/<date>-request-path.json and prints the table for README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import run

HERE = Path(__file__).resolve().parent
LEVELS = (1, 64, 256)
FLOOR = "plain FastAPI route, same models (FastAPI's floor)"


def worktree(revision: str) -> Path:
    """A checkout of ``revision`` beside this one (made once, reused)."""
    sha = subprocess.run(["git", "rev-parse", "--short", revision], capture_output=True, text=True, check=True).stdout
    path = Path("/tmp") / f"gymhost-baseline-{sha.strip()}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), revision], check=True, capture_output=True)
    return path


def baseline_environment(revision: str) -> dict[str, str]:
    """What a process needs in its environment to import ``revision``'s gymhost (its worktree's ``src`` ahead of
    this checkout's), checked by importing it once."""
    tree = worktree(revision)
    environment = {"PYTHONPATH": str(tree / "src")}
    imported = subprocess.run(
        [run.PYTHON, "-c", "import gymhost; print(gymhost.__file__)"],
        capture_output=True, text=True, check=True, env={**run.os.environ, **environment},
    ).stdout.strip()  # fmt: skip
    assert imported.startswith(str(tree)), f"the baseline would import {imported}, not {tree}'s gymhost"
    return environment


def start_servers(
    stack: contextlib.ExitStack, servers: dict[str, tuple[list[str], dict[str, str]]], serve: list[str],
    row: dict[str, Any],
) -> dict[str, tuple[str, str, int]]:  # fmt: skip
    """Each server (its command and environment) up on a port of its own until ``stack`` closes, with a seeded
    episode's cookie for those that are ``serve`` (the floors keep no session), and warmed up: by name, its URL,
    cookie and pid."""
    targets = {}
    for name, (command, env) in servers.items():
        port = run.free_port()
        url = f"http://127.0.0.1:{port}"
        served = command[: len(serve)] == serve  # `gymhost serve`, not one of the floors
        argv = [*command, "--port", str(port)] if served else [*command, str(port)]
        process = stack.enter_context(run.server(argv, url, env=env))
        cookie = run.seed_cookie(url, row) if served else ""
        run.wrk(f"{url}/get_weather", 16, 1, cookie)  # warm up
        targets[name] = (url, cookie, process.pid)
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4)
    given = parser.parse_args()
    folder = run.gym_root() / run.EXAMPLE
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    serve = [run.PYTHON, "-m", "gymhost", "serve", str(folder), "--log-level", "warning"]
    servers: dict[str, tuple[list[str], dict[str, str]]] = {
        f"baseline ({given.baseline})": (serve, baseline_environment(given.baseline)),
        "this checkout": (serve, {}),
        "this checkout, --masked-verdicts answer": ([*serve, "--masked-verdicts", "answer"], {}),
        "Gym's app, no middleware (Gym's own floor)": ([run.PYTHON, str(HERE / "gym_app_bare.py"), str(folder)], {}),
        FLOOR: ([run.PYTHON, str(HERE / "fastapi_app.py")], {}),
    }
    samples: dict[str, dict[int, list[dict[str, Any]]]] = {name: {c: [] for c in LEVELS} for name in servers}
    with contextlib.ExitStack() as stack:
        targets = start_servers(stack, servers, serve, row)
        for number in range(given.rounds):
            for c in LEVELS:
                for name, (url, cookie, pid) in run.in_turn(targets, number):
                    before = run.cpu_seconds(pid)
                    result = run.wrk(f"{url}/get_weather", c, given.seconds, cookie)
                    result["cpu_us_per_request"] = (
                        (run.cpu_seconds(pid) - before) / (result["rps"] * given.seconds) * 1e6
                    )
                    samples[name][c].append(result)
    results = {
        name: {
            str(c): {
                **run._median_run(samples[name][c]),
                "cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in samples[name][c]),
            }
            for c in LEVELS
        }
        for name in servers
    }
    record = {"date": datetime.date.today().isoformat(), "baseline": given.baseline, "machine": run.machine()}
    record["results"] = results
    out = HERE / "results" / f"{record['date']}-request-path.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    first, floor = next(iter(results.values())), results[FLOOR]
    print(
        "| server | c=1 calls/s | c=64 calls/s | c=64 p99 ms | c=256 calls/s | c=256 p99 ms | CPU/call, µs (c=64) "
        "| vs baseline (c=64) | vs FastAPI's floor (c=1, 64, 256) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        one, many, most = rows["1"], rows["64"], rows["256"]
        ratio = many["rps"] / first["64"]["rps"]
        floors = ", ".join(f"{rows[str(c)]['rps'] / floor[str(c)]['rps']:.2f}" for c in LEVELS)
        print(
            f"| {name} | {one['rps']:,.0f} | {many['rps']:,.0f} | {many['p99_ms']:.2f} | {most['rps']:,.0f} | "
            f"{most['p99_ms']:.2f} | {many['cpu_us_per_request']:.0f} | {ratio:.2f}x | {floors} |"
        )
    print(f"(raw: {out.relative_to(HERE)})", file=sys.stderr)


if __name__ == "__main__":
    main()
