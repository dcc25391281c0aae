"""`make demo`: serve a resources server nemo-gym ships, play its example rows like verifiers, print rewards.

It starts `gymhost serve` as its own process on a free loopback port, plays every row of the example data of
`example_session_state_mgmt` (a stateful counter: seed it, add to it, read it back, get verified), and stops the
server again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gymhost import EpisodeClient

EXAMPLE = "example_session_state_mgmt"


def gym_example_folder(name: str) -> Path:
    spec = importlib.util.find_spec("resources_servers")
    for location in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        if (Path(location) / name).is_dir():
            return Path(location) / name
    raise SystemExit(f"demo: nemo-gym's {name} folder not found; install gymhost[nemo-gym]")


def start_server(folder: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "gymhost", "serve", str(folder), "--port", "0", "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"at (http://\S+)", line)
    if not match:
        process.terminate()
        raise SystemExit(f"demo: the server did not start: {line}")
    url = match.group(1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.terminate()
    raise SystemExit("demo: the server did not answer within 60 s")


async def play(url: str, row: dict[str, Any]) -> float:
    """The counter starts at initial_count; adding the difference makes it expected_count."""
    async with EpisodeClient(url) as episode:
        await episode.seed(row)
        await episode.call_tool("increment_counter", {"count": row["expected_count"] - row["initial_count"]})
        count = json.loads((await episode.call_tool("get_counter_value", {})).text)["count"]
        answer = await episode.verify(row, f"The count is {count}.")
        return float(answer["reward"])


async def main() -> None:
    folder = gym_example_folder(EXAMPLE)
    rows = [json.loads(line) for line in (folder / "data" / "example.jsonl").read_text().splitlines() if line]
    process, url = start_server(folder)
    try:
        print(f"serving {EXAMPLE} at {url}; playing {len(rows)} rows")
        rewards = [await play(url, row) for row in rows]
        for index, (row, reward) in enumerate(zip(rows, rewards, strict=True)):
            start, target = row["initial_count"], row["expected_count"]
            print(f"  row {index}: start {start:>3}, target {target:>3} -> reward {reward}")
        print(f"mean reward {sum(rewards) / len(rewards):.2f}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)


if __name__ == "__main__":
    asyncio.run(main())
