"""Process mode against in-process mode, and against the code before a change (make bench-process-mode
BASELINE=<revision>).

gridsim written with default options in each mode, one `gymhost serve` each, all up at once (and, given a BASELINE,
the same two on that revision: a git worktree imported ahead of this checkout through PYTHONPATH, which the template
and its instances inherit); and, on this checkout, process mode with its instances reused from one episode to the
next (`source.fresh_instances=false`), which shows what the fresh fork each episode gets by default costs. Each
round plays 64 concurrent episodes of 40 tool calls on each server in turn (`run.sixty_four`: the pool grown to 64
first; each episode's fresh instance starts within the run, as it does in training), after a round on each that is
not counted, the order rotated by one place a round (`run.in_turn`). Each server's point is its median round, with
the CPU of the server's own process and of its instance processes a request, from `/proc` (the instances' as the
rest of the machine's: `run.sixty_four`). The ratio process / in-process is taken round by round (the two ran in the
same round, minutes apart at most) and its median reported. Writes results/<date>-process-mode.json and the README's
block.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path
from typing import Any

import run

MODES = ("process", "in-process")
REUSED = "process, instances reused"  # this checkout's only: a revision before issue 43 had no fresh instances


def measure(rounds: int, baseline: str | None = None) -> dict[str, Any]:
    revisions: dict[str, dict[str, str]] = {"checkout": {}}
    if baseline is not None:
        from request_path import baseline_environment

        revisions["baseline"] = baseline_environment(baseline)
    samples: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="gymhost-process-mode-") as scratch, contextlib.ExitStack() as stack:
        targets: dict[str, tuple[str, str, int]] = {}
        ways: list[tuple[str, str, str, tuple[str, ...]]] = [
            (revision, mode, mode, ()) for revision in revisions for mode in MODES
        ]
        ways.append(("checkout", REUSED, "process", ("source.fresh_instances=false",)))
        for revision, label, mode, settings in ways:
            folder = run.write_gridsim(Path(scratch) / f"{revision}-{len(targets)}", instances=None, mode=mode)
            port = run.free_port()
            url = f"http://127.0.0.1:{port}"
            serve = run.gymhost_serve(folder, port, *settings)
            process = stack.enter_context(run.server(serve, url, env=revisions[revision]))
            name = f"{revision} {label}"
            targets[name] = (url, str(folder / "data" / "eval.jsonl"), process.pid)
            samples[name] = []
        for url, rows, pid in targets.values():  # a round not counted: the first after a start ran slow everywhere
            run.sixty_four(url, rows, pid, quick=True)
        for number in range(rounds):
            for name, (url, rows, pid) in run.in_turn(targets, number):
                samples[name].append(run.sixty_four(url, rows, pid, quick=False))
            played = ", ".join(f"{name} {rounds_[-1]['calls_per_s']:.0f}/s" for name, rounds_ in samples.items())
            print(f"  round {number + 1}: {played}")
    servers = {name: _median(played) for name, played in samples.items()}
    out: dict[str, Any] = {"rounds": rounds, "baseline": baseline, "servers": servers}
    out["process_vs_in_process"] = {
        revision: _median_ratio(samples[f"{revision} process"], samples[f"{revision} in-process"])
        for revision in revisions
    }
    out["reused_vs_in_process"] = _median_ratio(samples[f"checkout {REUSED}"], samples["checkout in-process"])
    if baseline is not None:
        out["checkout_vs_baseline"] = {
            mode: _median_ratio(samples[f"checkout {mode}"], samples[f"baseline {mode}"]) for mode in MODES
        }
    return out


def _median(played: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round by calls/s, with every round's calls/s and CPU figures."""
    chosen = dict(sorted(played, key=lambda p: p["calls_per_s"])[len(played) // 2])
    for key in ("calls_per_s", "gymhost_cpu_ms_per_request", "instances_cpu_ms_per_request"):
        chosen[f"rounds_{key}"] = [p[key] for p in played]
    return chosen


def _median_ratio(over: list[dict[str, Any]], under: list[dict[str, Any]]) -> dict[str, Any]:
    rounds = [round(a["calls_per_s"] / b["calls_per_s"], 2) for a, b in zip(over, under, strict=True)]
    return {"median": statistics.median_high(rounds), "rounds": rounds}  # a round's, as ``_median`` picks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    given = parser.parse_args()
    run.write_section("process_mode", lambda: measure(given.rounds, given.baseline))


if __name__ == "__main__":
    main()
