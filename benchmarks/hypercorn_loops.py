"""hypercorn's event loop, chosen by the tail (make bench-hypercorn; a full `make bench` runs it too).

One tool call of a seeded episode (`POST /get_weather` on nemo-gym's example_single_tool_call, with the session
cookie) at 256 connections, against three servers up at once: `gymhost serve --server hypercorn`, and the same app
under hypercorn's own command on each loop it offers (`hypercorn gymhost.asgi:app -k asyncio` and `-k uvloop`, with
gymhost's backlog and keep-alive). wrk (one thread, keep-alive) with a 10 s timeout, so a slow request is counted in
the latencies instead of as an error past wrk's default 2 s; rounds interleaved, so a machine that slows down slows
all three alike. Each server's p50, p99 and max of every round; the table shows the median round's p50, p99 and
throughput, and the worst round's max. Writes results/<date>-hypercorn.json and the README's hypercorn block.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
from pathlib import Path
from typing import Any

import run

HERE = Path(__file__).resolve().parent
CONNECTIONS = 256


def servers(folder: Path) -> dict[str, Any]:
    hypercorn = [run.PYTHON, "-m", "hypercorn", "gymhost.asgi:app", "--backlog", "16384", "--keep-alive", "30"]
    gymhost = [run.PYTHON, "-m", "gymhost", "serve", str(folder), "--log-level", "warning", "--server", "hypercorn"]
    return {
        "gymhost_hypercorn": lambda port: [*gymhost, "--port", str(port)],
        "hypercorn_asyncio": lambda port: [*hypercorn, "--bind", f"127.0.0.1:{port}", "-k", "asyncio"],
        "hypercorn_uvloop": lambda port: [*hypercorn, "--bind", f"127.0.0.1:{port}", "-k", "uvloop"],
    }


def measure(seconds: int, rounds: int) -> dict[str, Any]:
    folder = run.gym_root() / run.EXAMPLE
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    samples: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        targets = {}
        for name, command in servers(folder).items():
            port = run.free_port()
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(run.server(command(port), url, env={"GYMHOST_FOLDER": str(folder)}))
            cookie = run.seed_cookie(url, row)
            run.wrk(f"{url}/get_weather", 16, 1, cookie)  # warm up
            targets[name] = (url, cookie)
            samples[name] = []
        for number in range(rounds):
            for name, (url, cookie) in run.in_turn(targets, number):
                samples[name].append(run.wrk(f"{url}/get_weather", CONNECTIONS, seconds, cookie, timeout_s=10))
    out: dict[str, Any] = {"connections": CONNECTIONS, "seconds": seconds, "servers": {}}
    for name, runs in samples.items():
        middle = sorted(runs, key=lambda r: r["p99_ms"])[len(runs) // 2]
        out["servers"][name] = {
            "rps": statistics.median(r["rps"] for r in runs),
            "p50_ms": middle["p50_ms"],
            "p99_ms": middle["p99_ms"],
            "max_ms": max(r["max_ms"] for r in runs),
            "errors": sum(r["errors"] + r["socket_errors"] for r in runs),
            "rounds": runs,
        }
        print(f"  {name}: p99 {middle['p99_ms']} ms, max {out['servers'][name]['max_ms']} ms")
    ours, theirs = out["servers"]["gymhost_hypercorn"], out["servers"]["hypercorn_asyncio"]
    out["p99_vs_hypercorn_asyncio"] = round(ours["p99_ms"] / theirs["p99_ms"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short measurements, for checking the harness")
    args = parser.parse_args()
    seconds, rounds = (2, 1) if args.quick else (20, 3)
    results: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                               "machine": run.machine(), "quick": args.quick}  # fmt: skip
    print("hypercorn's loops:")
    results["hypercorn"] = measure(seconds, rounds)
    run.write_results(results, results["date"][:10] + "-hypercorn" + ("-quick" if args.quick else ""))


if __name__ == "__main__":
    main()
