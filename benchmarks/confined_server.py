"""A Gym server's own process confined (`--sandbox strict`) beside unconfined (`--sandbox off`): issue 43, item 4's
costs (make bench-confined-server).

Gym's example_single_tool_call served by `gymhost serve`, each way, in interleaved rounds; each round starts both
servers afresh:

- start: from the command's start to the first 200 of `/readyz` (wall);
- tool calls: wrk at 64 connections on one seeded episode's `get_weather`, requests/s and p99;
- memory: the resident set of every process the command runs (confined: the supervisor, bubblewrap's two and the
  server; unconfined: the server), once ready and after the calls.

A confined server runs the same code on the same request path: what it may cost is its start (a sandbox, a second
Python for the supervisor) and the supervisor's memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import run

SANDBOXES = ("strict", "off")


def measure(rounds: int, seconds: int) -> dict[str, Any]:
    folder = run.gym_root() / run.EXAMPLE
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    played: dict[str, list[dict[str, Any]]] = {sandbox: [] for sandbox in SANDBOXES}
    for number in range(rounds):
        for sandbox, _ in run.in_turn(dict.fromkeys(SANDBOXES), number):
            port = run.free_port()
            url = f"http://127.0.0.1:{port}"
            command = [run.PYTHON, "-m", "gymhost", "serve", str(folder), "--port", str(port), "--log-level",
                       "warning", "--sandbox", sandbox]  # fmt: skip
            began = time.monotonic()
            with run.server(command, url, ready="/readyz") as process:
                start_ms = (time.monotonic() - began) * 1000
                ready_mb = _tree_mb(process.pid)
                cookie = run.seed_cookie(url, row)
                run.wrk(f"{url}/get_weather", 16, 1, cookie)  # warm up
                calls = run.wrk(f"{url}/get_weather", 64, seconds, cookie)
                played[sandbox].append({"start_ms": round(start_ms, 1), "ready_mb": ready_mb,
                                        "after_calls_mb": _tree_mb(process.pid), "calls": calls})  # fmt: skip
            print(f"  {sandbox}: ready in {start_ms:.0f} ms, {calls['rps']:.0f} calls/s, {ready_mb} MB")
    out: dict[str, Any] = {"rounds": rounds, "seconds": seconds}
    for sandbox, runs in played.items():
        out[sandbox] = {
            "start_ms": statistics.median(r["start_ms"] for r in runs),
            "rps": statistics.median(r["calls"]["rps"] for r in runs),
            "p99_ms": statistics.median(r["calls"]["p99_ms"] for r in runs),
            "ready_mb": statistics.median(r["ready_mb"] for r in runs),
            "after_calls_mb": statistics.median(r["after_calls_mb"] for r in runs),
            "errors": sum(r["calls"]["errors"] + r["calls"]["socket_errors"] for r in runs),
            "rounds": runs,
        }
    pairs = list(zip(played["strict"], played["off"], strict=True))
    out["rps_ratio"] = _ratios([s["calls"]["rps"] / o["calls"]["rps"] for s, o in pairs])
    out["start_ratio"] = _ratios([s["start_ms"] / o["start_ms"] for s, o in pairs])
    out["memory_added_mb"] = round(out["strict"]["ready_mb"] - out["off"]["ready_mb"], 1)
    return out


def _tree_mb(pid: int) -> float:
    """The resident set of ``pid`` and every process under it."""
    total = 0.0
    for member in [pid, *run.tree(pid)]:
        try:
            total += run.resident_mb(member)
        except OSError:
            continue
    return round(total, 1)


def _ratios(rounds: list[float]) -> dict[str, Any]:
    rounded = [round(ratio, 2) for ratio in rounds]
    return {"median": statistics.median_high(rounded), "rounds": rounded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, both servers started afresh")
    parser.add_argument("--seconds", type=int, default=10, help="wrk's run at 64 connections")
    given = parser.parse_args()
    run.write_section("confined_server", lambda: measure(given.rounds, given.seconds))


if __name__ == "__main__":
    main()
