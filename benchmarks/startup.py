"""A server's start, before and after a change, side by side (make bench-startup BASELINE=<git revision>).

``gymhost serve example_single_tool_call`` (an installed Gym server by name) of this checkout and of the BASELINE
revision (a git worktree imported ahead of this checkout through PYTHONPATH, in the same venv), started in turn,
ROUNDS times each: from the process's start to the first 200 of ``/readyz``, the CPU the process used by then (from
``/proc``) and its resident memory idle after it (VmRSS). Run by each nemo-gym venv's interpreter (make runs both).
Writes results/<date>-startup-<nemo-gym version>.json and prints the table for README.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import request_path
import run

HERE = Path(__file__).resolve().parent
ROUNDS = 7


def start_once(environment: dict[str, str]) -> dict[str, float]:
    port = run.free_port()
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "gymhost", "serve", "example_single_tool_call", "--port", str(port)],
        env={**os.environ, **environment}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gymhost serve exited with {process.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.01)
        ready_s = time.monotonic() - began
        return {"ready_s": ready_s, "cpu_s": run.cpu_seconds(process.pid), "rss_mb": run.resident_mb(process.pid)}
    finally:
        process.terminate()
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    version = importlib.metadata.version("nemo-gym")
    cases = {"baseline": request_path.baseline_environment(args.baseline), "this checkout": {}}
    runs: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    for round_number in range(args.rounds):
        for case, environment in run.in_turn(cases, round_number):
            runs[case].append(start_once(environment))
    medians = {
        case: {key: round(statistics.median(r[key] for r in measured), 3) for key in ("ready_s", "cpu_s", "rss_mb")}
        for case, measured in runs.items()
    }
    result: dict[str, Any] = {
        "machine": run.machine(), "nemo_gym": version, "baseline": args.baseline, "rounds": args.rounds,
        "medians": medians, "runs": runs,
    }  # fmt: skip
    out = HERE / "results" / f"{datetime.date.today()}-startup-{version}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"nemo-gym {version}, {args.rounds} starts each (medians); {out.relative_to(HERE)}")
    print("| gymhost serve example_single_tool_call | ready | CPU to ready | resident idle |")
    print("|---|---|---|---|")
    for case, median in medians.items():
        label = f"baseline ({args.baseline})" if case == "baseline" else case
        print(f"| {label} | {median['ready_s']:.2f} s | {median['cpu_s']:.2f} s | {median['rss_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
