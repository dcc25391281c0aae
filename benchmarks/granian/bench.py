"""Tool calls on uvicorn vs granian, bare endpoint vs gymhost, side by side, interleaved rounds, medians.

Not part of `make bench`: granian is not a gymhost dependency (benchmarks/README.md says why). To rerun, in a venv
with nemo-gym 0.7.0, gymhost and granian (`pip install granian`): `python benchmarks/granian/bench.py [--seconds 4]
[--rounds 3] [--conc 1,64,256] [--only a,b]` -> results.json + a table. It uses benchmarks/run.py's own helpers
(server(), wrk(), seed_cookie(), _median_run()), so the method is make bench's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import os

import run

CLK = os.sysconf("SC_CLK_TCK")


def session_cpu(sid: int) -> float:
    """CPU seconds (user+sys) of every process in session `sid` (the server and any worker it forked)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # session id
            total += int(fields[11]) + int(fields[12])
    return total / CLK


HERE = Path(__file__).resolve().parent
PY = sys.executable
GRANIAN = str(Path(PY).parent / "granian")
FOLDER = run.gym_root() / run.EXAMPLE
BENCH = str(Path(__file__).resolve().parent.parent)
GRANIAN_CLI = [
    GRANIAN,
    "--interface",
    "asgi",
    "--host",
    "127.0.0.1",
    "--workers",
    "1",
    "--loop",
    "uvloop",
    "--http",
    "1",
    "--no-ws",
    "--log-level",
    "warning",
    "--backlog",
    "2048",
]

SERVERS = {
    # (a) make bench's bare endpoint, as make bench runs it (uvicorn.run: httptools + uvloop)
    "bare_uvicorn": lambda p: ([PY, f"{BENCH}/bare_app.py", str(p)], None, {}),
    # (b) the same app object on the candidate _run_granian (embedded granian, pre-bound socket)
    "bare_granian": lambda p: ([PY, str(HERE / "serve.py"), "bare", str(p), "granian"], None, {}),
    # (b') the same app under granian's own CLI (one worker process, import string): is embed slower?
    "bare_granian_cli": lambda p: ([*GRANIAN_CLI, "--port", str(p), "--working-dir", BENCH, "bare_app:app"], None, {}),
    # (c) gymhost serve, exactly
    "gymhost_uvicorn": lambda p: (
        [PY, "-m", "gymhost", "serve", str(FOLDER), "--port", str(p), "--log-level", "warning"],
        None,
        {},
    ),
    # (d) what gymhost serve does, with _run_granian instead of _run_uvicorn
    "gymhost_granian": lambda p: ([PY, str(HERE / "serve.py"), str(FOLDER), str(p), "granian"], None, {}),
    # (d') gymhost.asgi:app under granian's CLI (the import-string route)
    "gymhost_granian_cli": lambda p: (
        [*GRANIAN_CLI, "--port", str(p), "gymhost.asgi:app"],
        None,
        {"GYMHOST_FOLDER": str(FOLDER), "GYMHOST_SECRET": "x" * 32},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conc", default="1,64,256")
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    conc = [int(c) for c in args.conc.split(",")]
    names = [n for n in SERVERS if not args.only or n in args.only.split(",")]
    row = json.loads((FOLDER / "data" / "example.jsonl").read_text().splitlines()[0])
    samples = {n: {c: [] for c in conc} for n in names}
    with contextlib.ExitStack() as stack:
        targets = {}
        for name in names:
            port = run.free_port()
            command, cwd, env = SERVERS[name](port)
            url = f"http://127.0.0.1:{port}"
            process = stack.enter_context(run.server(command, url, cwd=cwd, env=env))
            cookie = run.seed_cookie(url, row) if name.startswith("gymhost") else ""
            run.wrk(f"{url}/get_weather", 16, 1, cookie)  # warm up
            targets[name] = (url, cookie, process.pid)
            print(f"up: {name} at {url} cookie={'yes' if cookie else 'no'}", flush=True)
        for r in range(args.rounds):
            for c in conc:
                for name, (url, cookie, pid) in targets.items():
                    before = session_cpu(pid)
                    result = run.wrk(f"{url}/get_weather", c, args.seconds, cookie)
                    cpu = session_cpu(pid) - before
                    result["cpu_us_per_req"] = round(cpu * 1e6 / max(1.0, result["rps"] * args.seconds), 1)
                    samples[name][c].append(result)
                    errors = f"{result['errors']}/{result['socket_errors']}"
                    print(
                        f"round {r} c={c} {name}: {result['rps']:.0f}/s p50 {result['p50_ms']} p99 "
                        f"{result['p99_ms']} cpu/req {result['cpu_us_per_req']}us err {errors}",
                        flush=True,
                    )
    results = {n: {c: run._median_run(samples[n][c]) for c in conc} for n in names}
    cpu = {
        n: {c: sorted(r["cpu_us_per_req"] for r in samples[n][c])[len(samples[n][c]) // 2] for c in conc} for n in names
    }
    for n in names:
        for c in conc:
            results[n][c]["cpu_us_per_req_median"] = cpu[n][c]
            results[n][c]["rounds_cpu_us_per_req"] = [r["cpu_us_per_req"] for r in samples[n][c]]
    Path(args.out).write_text(json.dumps(results, indent=1))
    print()
    print("| server | c | req/s (median) | rounds | p50 ms | p99 ms | server CPU us/req (median) | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        for c in conc:
            m = results[n][c]
            rounds = ", ".join(f"{x:.0f}" for x in m["rounds_rps"])
            print(
                f"| {n} | {c} | {m['rps']:.0f} | {rounds} | "
                f"{m['p50_ms']} | {m['p99_ms']} | {cpu[n][c]:.0f} | {m['errors']}+{m['socket_errors']} |"
            )
    print()
    for server in ("uvicorn", "granian", "granian_cli"):
        bare, gym = f"bare_{server}", f"gymhost_{server}"
        if bare in results and gym in results:
            ratios = ", ".join(f"c={c} {results[gym][c]['rps'] / results[bare][c]['rps']:.2f}" for c in conc)
            print(f"gymhost/bare throughput on {server}: {ratios}")
            ratios = ", ".join(f"c={c} {cpu[gym][c] / cpu[bare][c]:.2f}" for c in conc)
            print(f"gymhost/bare server CPU per request on {server}: {ratios}")


if __name__ == "__main__":
    main()
