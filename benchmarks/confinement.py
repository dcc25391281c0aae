"""Confined process instances beside unconfined ones (issue 43's costs; make bench-confinement).

gridsim written with default options (process mode), served at once: `--sandbox strict` (namespaces: bubblewrap,
and each instance's own namespaces and scratch) and `--sandbox off`, both with a fresh instance for each episode
(the default); and `--sandbox strict` with instances reused for episode after episode (`fresh_instances: false`), so
the price of freshness stands apart from the price of confinement. In one run:

- tool calls: 64 concurrent episodes of 40 tool calls on a pool grown to 64 (`run.sixty_four`), in interleaved
  rounds (`run.in_turn`); each server's median round, and the median of the rounds' ratios (confined against
  unconfined; fresh against reused, both confined);
- a cold batch: 256 think-time episodes at once on an idle default pool (4 instances up, ``run.idle_pool``), on
  fresh servers in interleaved rounds; the round with the median seed p99 of each;
- 40 instance starts each way by the launcher the pool uses, one after another, the two ways in turn (each on a
  template of its own, settled first): wall time a start (median, p99 of the 40),
  the CPU of each process a start, and an idle instance's proportional set size.

Issue 43's targets: calls/s >= 0.9x unconfined, instance start p99 <= 2x, the cold batch's seed p99 <= 1.2x.
Writes results/<date>-confinement.json and the README's block.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path
from typing import Any

import run

STARTS = 40  # instance starts each way
SANDBOXES = ("strict", "off")  # strict: namespaces or no start, so the confined side cannot silently be unconfined
REUSED = "reused"  # strict, with instances reused between episodes


def measure(rounds: int, batch_rounds: int, episodes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rounds, "batch_rounds": batch_rounds, "episodes": episodes}
    # Served from outside the temporary folder, as a deployment's folders are: a confined instance binds again into
    # its own /tmp whatever of the server's lives under it (the bundle, here), a mount more a start.
    with tempfile.TemporaryDirectory(prefix="gymhost-confinement-", dir=Path(__file__).parent) as scratch:
        folder = run.write_gridsim(Path(scratch) / "gridsim", instances=None, mode="process")
        rows = str(folder / "data" / "eval.jsonl")
        calls: dict[str, list[dict[str, Any]]] = {server: [] for server in (*SANDBOXES, REUSED)}
        with contextlib.ExitStack() as stack:
            targets = {}
            for server in calls:
                port = run.free_port()
                url = f"http://127.0.0.1:{port}"
                settings = ["source.fresh_instances=false"] if server == REUSED else []
                command = run.gymhost_serve(folder, port, *settings)
                process = stack.enter_context(run.server(command, url, env=_env(_sandbox(server))))
                targets[server] = (url, process.pid)
            for url, pid in targets.values():  # a round not counted: the first after a start ran slow everywhere
                run.sixty_four(url, rows, pid, quick=True)
            for number in range(rounds):
                for sandbox, (url, pid) in run.in_turn(targets, number):
                    calls[sandbox].append(run.sixty_four(url, rows, pid, quick=False))
                print("  calls, round", number + 1, {s: played[-1]["calls_per_s"] for s, played in calls.items()})
        out["calls"] = {server: _median(played, "calls_per_s") for server, played in calls.items()}
        paired = zip(calls["strict"], calls["off"], strict=True)
        out["calls_ratio"] = _ratios([confined["calls_per_s"] / open_["calls_per_s"] for confined, open_ in paired])
        paired = zip(calls["strict"], calls[REUSED], strict=True)
        out["fresh_ratio"] = _ratios([fresh["calls_per_s"] / reused["calls_per_s"] for fresh, reused in paired])
        # What a fresh instance costs an episode: the two cores' time an episode takes, fresh less reused.
        fresh, reused = (out["calls"][server]["episodes_per_s"] for server in ("strict", REUSED))
        out["fresh_ms_per_episode"] = round(2000 * (1 / fresh - 1 / reused), 2)

        batches: dict[str, list[dict[str, Any]]] = {sandbox: [] for sandbox in SANDBOXES}
        for number in range(batch_rounds):
            for sandbox, _ in run.in_turn(dict.fromkeys(SANDBOXES), number):
                port = run.free_port()
                url = f"http://127.0.0.1:{port}"
                with run.server(run.gymhost_serve(folder, port), url, env=_env(sandbox)) as process:
                    run.idle_pool(url)
                    think = run.loadgen("think", url, rows, "--pid", str(process.pid), "--episodes", str(episodes),
                                        "--think", "0.5", "--calls", "4")  # fmt: skip
                batches[sandbox].append(think)
                print(f"  batch, {sandbox}: seed p50/p99 {think['seed'].get('p50_ms')}/{think['seed'].get('p99_ms')}"
                      f" ms, {think['errors']} errors")  # fmt: skip
        out["batch"] = {
            sandbox: {
                "think_time": sorted(played, key=_seed_p99)[len(played) // 2],
                "seed_p99_ms_of_each_round": [_seed_p99(think) for think in played],
            }
            for sandbox, played in batches.items()
        }
        paired_batches = zip(batches["strict"], batches["off"], strict=True)
        out["batch_p99_ratio"] = _ratios([_seed_p99(confined) / _seed_p99(open_) for confined, open_ in paired_batches])

        ways = {sandbox: {"sandbox": sandbox} for sandbox in SANDBOXES}
        out["starts"] = run.instance_starts_in_turn(folder, STARTS, ways)  # one of each in turn: same minutes
        out["starts_in_turn"] = True
        strict, off = out["starts"]["strict"], out["starts"]["off"]
        out["start_p99_ratio"] = round(strict["wall_p99_ms"] / off["wall_p99_ms"], 2)
    return out


def _env(sandbox: str) -> dict[str, str]:
    return {"GYMHOST_SANDBOX": sandbox}


def _sandbox(server: str) -> str:
    return "strict" if server == REUSED else server


def _seed_p99(think: dict[str, Any]) -> float:
    return float(think["seed"].get("p99_ms") or float("inf"))  # no seed answered: no p99


def _median(played: list[dict[str, Any]], key: str) -> dict[str, Any]:
    chosen = dict(sorted(played, key=lambda p: p[key])[len(played) // 2])
    chosen[f"rounds_{key}"] = [p[key] for p in played]
    return chosen


def _ratios(rounds: list[float]) -> dict[str, Any]:
    rounded = [round(ratio, 2) for ratio in rounds]
    return {"median": statistics.median_high(rounded), "rounds": rounded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of tool calls")
    parser.add_argument("--batch-rounds", type=int, default=7, help="interleaved cold batches")
    parser.add_argument("--episodes", type=int, default=256, help="think-time episodes in a cold batch")
    given = parser.parse_args()
    run.write_section("confinement", lambda: measure(given.rounds, given.batch_rounds, given.episodes))


if __name__ == "__main__":
    main()
