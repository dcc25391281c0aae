"""A written server's tool call against its bare endpoint, and against the dispatch before (make bench-written
BASELINE=<revision>; a full `make bench` runs it without a baseline).

gridsim written in-process (two instances), one seeded episode's `POST /gridsim_look` with its cookie, against:
(a) `written_bare_app.py`, the same call on an in-process gridsim instance from a bare Starlette endpoint (the
practical limit), (b) `gymhost serve` of this checkout and, given a BASELINE, (c) `gymhost serve` of that revision
(a git worktree imported ahead of this checkout through PYTHONPATH, in the same venv). All up at once, wrk (one
thread, keep-alive) at 1, 64 and 256 connections, rounds interleaved, the order rotated by one place a round
(`run.in_turn`); each point is its median round, with the server process's CPU a request from `/proc`. Writes
results/<date>-written.json and the README's written block.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import run

HERE = Path(__file__).resolve().parent
TOOL, BODY = "gridsim_look", "{}"


def measure(seconds: int, rounds: int, baseline: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gymhost-written-") as scratch:
        folder = run.write_gridsim(Path(scratch), instances=2, mode="in-process")
        row = json.loads((folder / "data" / "eval.jsonl").read_text().splitlines()[0])
        serve = [run.PYTHON, "-m", "gymhost", "serve", str(folder), "--log-level", "warning"]
        servers: dict[str, tuple[list[str], dict[str, str], bool]] = {
            "bare": ([run.PYTHON, str(HERE / "written_bare_app.py"), str(folder / "bundle")], {}, False),
            "gymhost": ([*serve, "--port"], {}, True),
        }
        if baseline is not None:
            from request_path import baseline_environment

            servers["baseline"] = ([*serve, "--port"], baseline_environment(baseline), True)
        samples: dict[str, dict[int, list[dict[str, Any]]]] = {n: {c: [] for c in run.CONCURRENCY} for n in servers}
        with contextlib.ExitStack() as stack:
            targets = {}
            for name, (command, env, seeded) in servers.items():
                port = run.free_port()
                url = f"http://127.0.0.1:{port}"
                process = stack.enter_context(run.server([*command, str(port)], url, env=env))
                cookie = run.seed_cookie(url, row) if seeded else ""
                run.wrk(f"{url}/{TOOL}", 16, 1, cookie, body=BODY)  # warm up
                targets[name] = (url, cookie, process.pid)
            for number in range(rounds):
                for c in run.CONCURRENCY:
                    for name, (url, cookie, pid) in run.in_turn(targets, number):
                        before = run.cpu_seconds(pid)
                        result = run.wrk(f"{url}/{TOOL}", c, seconds, cookie, body=BODY)
                        result["cpu_us_per_request"] = (
                            (run.cpu_seconds(pid) - before) / max(1.0, result["rps"] * seconds) * 1e6
                        )
                        samples[name][c].append(result)
    results: dict[str, Any] = {
        name: {
            str(c): {
                **run._median_run(samples[name][c]),
                "cpu_us_per_request": round(statistics.median(r["cpu_us_per_request"] for r in samples[name][c]), 1),
            }
            for c in run.CONCURRENCY
        }
        for name in servers
    }
    out: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "baseline": baseline, "servers": results}
    out["gymhost_vs_bare"] = {
        c: round(results["gymhost"][c]["rps"] / results["bare"][c]["rps"], 2) for c in results["bare"]
    }
    if baseline is not None:
        out["gymhost_vs_baseline"] = {
            c: round(results["gymhost"][c]["rps"] / results["baseline"][c]["rps"], 2) for c in results["bare"]
        }
    for name, rows in results.items():
        print(f"  written tool calls, {name}: " + ", ".join(f"c={c} {r['rps']:.0f}/s" for c, r in rows.items()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    given = parser.parse_args()
    run.write_section("written", lambda: measure(given.seconds, given.rounds, given.baseline))


if __name__ == "__main__":
    main()
