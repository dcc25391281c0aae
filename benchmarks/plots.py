"""The comparisons of a `make bench` run drawn as SVG (matplotlib), from its results JSON.

    python plots.py results/2026-12-03.json      # redraws them from any full run's results

`run.py` calls `draw` at the end of a full run. Each figure is written to plots/ under a fixed name (so
benchmarks/README.md and the docs show the latest run's), each with the run's date and machine in its title:

- tool-calls.svg: tool calls a second and their p99 against connections, for gymhost and its floors (the bare
  endpoint, FastAPI's floor) and Gym's own launcher;
- cold-batch.svg: a cold batch's seed p99 round by round, the environment constructed for each instance and once
  in the template;
- process-mode.svg: process mode's calls a second against in-process mode's, round by round.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller files, searchable, the reader's fonts
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
PLOTS = HERE / "plots"
_SERVERS = {  # what the tool-call figure draws, in its legend's words
    "gymhost_uvicorn": "gymhost serve",
    "plain_fastapi": "FastAPI's floor (a plain route)",
    "bare_starlette": "the bare endpoint (Starlette)",
    "gym_launcher": "Gym's launcher",
}


def draw(results: dict[str, Any], folder: Path = PLOTS) -> list[Path]:
    """Every figure the results have the numbers for; the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    title = f"{results.get('date', '')}, {results.get('machine', {}).get('cores', '?')} cores"
    written = []
    for name, figure in (("tool-calls", _tool_calls), ("cold-batch", _cold_batch), ("process-mode", _process_mode)):
        drawn = figure(results, title)
        if drawn is not None:
            path = folder / f"{name}.svg"
            drawn.savefig(path, format="svg", metadata={"Date": None})  # no timestamp: a redraw is the same file
            plt.close(drawn)
            written.append(path)
    return written


def _tool_calls(results: dict[str, Any], title: str) -> Any:
    servers = {key: points for key, points in results.get("tool_calls", {}).items() if key in _SERVERS}
    if not servers:
        return None
    figure, (rate, tail) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for key, label in _SERVERS.items():
        points = sorted(servers.get(key, []), key=lambda point: point["concurrency"])
        if not points:
            continue
        connections = [point["concurrency"] for point in points]
        rate.plot(connections, [point["rps"] for point in points], marker="o", label=label)
        tail.plot(connections, [point["p99_ms"] for point in points], marker="o", label=label)
    ticks = sorted({point["concurrency"] for points in servers.values() for point in points})
    for axes, what in ((rate, "tool calls / s"), (tail, "p99, ms")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [str(tick) for tick in ticks])
        axes.minorticks_off()
        axes.set_xlabel("connections")
        axes.set_ylabel(what)
        axes.grid(True, alpha=0.3)
    tail.set_yscale("log")
    rate.legend(fontsize="small")
    figure.suptitle(f"One tool call of a seeded episode, wrk ({title})")
    return figure


def _cold_batch(results: dict[str, Any], title: str) -> Any:
    cold = results.get("cold_start") or {}
    variants = {"construct_each": "constructed in each instance", "construct_once": "constructed once (the default)"}
    rounds = {label: cold[key]["seed_p99_ms_of_each_round"] for key, label in variants.items() if key in cold}
    if not rounds:
        return None
    figure, axes = plt.subplots(figsize=(6, 4), layout="constrained")
    for label, values in rounds.items():
        axes.plot(range(1, len(values) + 1), [value / 1000 for value in values], marker="o", label=label)
    axes.axhline(2.0, color="grey", linestyle="--", label="target: 2 s")
    axes.set_xlabel("round")
    axes.set_ylabel("seed p99, s")
    axes.set_ylim(bottom=0)
    axes.set_xticks(range(1, max(len(values) for values in rounds.values()) + 1))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    axes.set_title(f"{cold.get('episodes', '?')} think-time episodes seeded at once on an idle pool\n({title})")
    return figure


def _process_mode(results: dict[str, Any], title: str) -> Any:
    mode = results.get("process_mode") or {}
    ratios = (mode.get("process_vs_in_process") or {}).get("checkout")
    servers = mode.get("servers") or {}
    if not ratios or "checkout process" not in servers:
        return None
    figure, (rate, ratio) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    labels = ["in-process", "process"]
    rate.bar(labels, [servers[f"checkout {label}"]["calls_per_s"] for label in labels], color=["#4c72b0", "#dd8452"])
    rate.set_ylabel("tool calls / s (median round)")
    rounds = ratios["rounds"]
    ratio.plot(range(1, len(rounds) + 1), rounds, marker="o", label="process / in-process, each round")
    ratio.axhline(0.7, color="grey", linestyle="--", label="target: 0.7")
    ratio.set_ylim(0, 1)
    ratio.set_xlabel("round")
    ratio.set_xticks(range(1, len(rounds) + 1))
    ratio.legend(fontsize="small")
    for axes in (rate, ratio):
        axes.grid(True, alpha=0.3, axis="y")
    figure.suptitle(f"64 concurrent episodes of 40 tool calls, process against in-process mode ({title})")
    return figure


if __name__ == "__main__":
    for path in draw(json.loads(Path(sys.argv[1]).read_text())):
        print(path)
