"""`make demo`: an agent environment, written as a Gym resources server, served, and played like verifiers plays it.

1. `gymhost write examples/gridsim_v1 ROOT` writes ROOT/resources_servers/gridsim_v1/ (a temporary ROOT).
2. `gymhost serve` runs it as its own process on a free loopback port (four gridsim instances behind it).
3. Every eval row is played the way verifiers' NeMo Gym taskset does (a new connection per call, the cookies of
   /seed_session sent with every later call), by a scripted "model" that follows the task's reference solution,
   and once more by one that gives up after its first move.
4. The rewards are printed, and the server is stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gymhost import EpisodeClient
from gymhost.environments import Task, awrite_folder, load_tasks

BUNDLE = Path(__file__).resolve().parent / "gridsim_v1"


def start_server(folder: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "gymhost", "serve", str(folder), "--port", "0", "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    match = None
    for line in process.stdout:  # what it says of its limits comes first, then where it serves
        match = re.search(r"serving .* at (http://\S+)", line)
        if match:
            break
    if not match:
        process.terminate()
        raise SystemExit("demo: the server did not start")
    url = match.group(1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.terminate()
    raise SystemExit("demo: the server did not answer within 60 s")


async def play(url: str, row: dict[str, Any], task: Task, *, give_up: bool) -> tuple[int, dict[str, Any]]:
    assert task.solution is not None
    calls = task.solution.tool_calls[:1] if give_up else task.solution.tool_calls
    # With GYMHOST_TOKEN set, the server requires it (liveness probes aside): send it as a trainer would.
    async with EpisodeClient(url, token=os.environ.get("GYMHOST_TOKEN")) as episode:
        await episode.seed(row)
        for call in calls:
            await episode.call_tool(call.name, call.arguments)
        return len(calls), await episode.verify(row, "" if give_up else task.solution.final_text)


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gymhost-demo-") as root:
        written = await awrite_folder(str(BUNDLE), root)
        print(f"wrote {written.path}")
        tasks = {task.id: task for task in load_tasks(BUNDLE / "tasks" / "eval.jsonl")}
        rows = [json.loads(line) for line in (written.path / "data" / "eval.jsonl").read_text().splitlines()]
        process, url = start_server(written.path)
        try:
            print(f"serving {written.name} at {url}; playing {len(rows)} rows\n")
            print(f"{'task':<20} {'calls':>5} {'reward':>7}   {'gives up':>8} {'reward':>7}")
            solved = await asyncio.gather(*(play(url, row, tasks[row["task_id"]], give_up=False) for row in rows))
            gave_up = await asyncio.gather(*(play(url, row, tasks[row["task_id"]], give_up=True) for row in rows))
            for row, (calls, answer), (short, failed) in zip(rows, solved, gave_up, strict=True):
                print(f"{row['task_id']:<20} {calls:>5} {answer['reward']:>7.2f}   {short:>8} {failed['reward']:>7.2f}")
            mean = sum(answer["reward"] for _, answer in solved) / len(solved)
            masked = sum(answer["mask_sample"] for _, answer in solved + gave_up)
            print(f"\nmean reward: {mean:.2f} following the reference solutions; masked samples: {masked}")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(20)


if __name__ == "__main__":
    asyncio.run(main())
