"""``gymhost top`` against real servers: what it shows of one under load, of one draining, of one that stops
answering and of an address nobody serves; lines on a pipe, a redrawn table on a terminal."""

from __future__ import annotations

import asyncio
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gymhost import EpisodeClient
from gymhost.environments import write_folder

from .agentenv_helpers import COUNTER_TASK, make_bundle, rows
from .processes import (
    CALL_TIMEOUT_S,
    STATE_TIMEOUT_S,
    ServerProcess,
    free_port,
    gymhost_command,
    on_a_terminal,
    serving,
)

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

TOKEN = "top-token"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("top")
    return write_folder(str(make_bundle(root, tasks=[COUNTER_TASK])), root / "root", instances="2:4").path


@contextmanager
def serve(folder: Path, *args: str) -> Iterator[ServerProcess]:
    with serving(gymhost_command("serve", str(folder), "--port", "0", *args), env={"GYMHOST_TOKEN": TOKEN}) as server:
        yield server


def top(*urls: str, count: int = 1, interval: float = 0.5, token: str | None = TOKEN) -> list[dict[str, str]]:
    """``gymhost top`` on a pipe: its logfmt lines, each as a dict."""
    command = gymhost_command("top", *urls, "--count", str(count), "--interval", str(interval))
    result = subprocess.run(
        [*command, *(["--token", token] if token else [])], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = [dict(pair.split("=", 1) for pair in shlex.split(line)[1:]) for line in result.stdout.splitlines()]
    assert len(lines) == count * len(urls), result.stdout
    return lines


async def test_top_shows_episodes_seeds_calls_latency_verdicts_and_the_pool(folder: Path) -> None:
    row = rows(folder)[0]
    with serve(folder) as server:
        async with EpisodeClient(server.url, token=TOKEN) as done:
            await done.seed(row)
            await done.call_tool("increment", {"by": 2})
            assert (await done.verify(row))["reward"] == 1.0
        async with EpisodeClient(server.url, token=TOKEN) as held:
            await held.seed(row)
            reading = asyncio.create_task(asyncio.to_thread(top, server.url, count=2, interval=1.0))

            async def seeding() -> None:
                while not reading.done():
                    async with EpisodeClient(server.url, token=TOKEN) as brief:
                        await brief.seed(row)
                        await brief.post("/close_session", {})

            async def calling() -> None:
                while not reading.done():
                    await held.call_tool("increment", {"by": 0})

            # Seeds and tool calls throughout both of top's readings, each kept going on its own: one after the
            # other, a busy machine's slow seed once left a second between readings without a call.
            async with asyncio.TaskGroup() as both:
                both.create_task(seeding())
                both.create_task(calling())
            first, second = await reading
        assert first["state"] == second["state"] == "ready"
        assert (first["seeds/s"], first["calls/s"]) == ("-", "-"), "no rate before a second reading"
        assert float(second["seeds/s"]) > 0
        assert float(second["calls/s"]) > 0
        assert second["p50"].endswith("ms")
        assert second["p99"].endswith("ms")
        assert int(second["open"]) >= 1  # the held episode, and maybe a brief one
        assert second["masked"] == "0/1"
        assert "leased:" in second["pool"]
        assert second["waiting"] in ("0", "1")  # one seed at a time, which may be waiting for its instance's start
        assert second["stops"] == "-"
        without_token = top(server.url, token=None)[0]
        assert without_token["state"] == "ready, /metrics refused (401: give --token)"
        assert without_token["open"] == "-"


async def test_top_shows_a_draining_server_one_that_stops_answering_and_one_not_there(folder: Path) -> None:
    row = rows(folder)[0]
    nobody = f"http://127.0.0.1:{free_port()}"
    with serve(folder, "--drain-timeout", "60") as server:
        async with EpisodeClient(server.url, token=TOKEN) as held:
            await held.seed(row)
            server.process.send_signal(signal.SIGTERM)  # it drains: the held episode keeps it up
            deadline = time.monotonic() + STATE_TIMEOUT_S
            while httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).status_code == 200:
                assert time.monotonic() < deadline, "the server never started its drain"
                await asyncio.sleep(0.05)
            draining, absent = top(server.url, nobody)
            assert draining["state"] == "draining"
            assert draining["open"] == "1"
            assert absent["state"] == "no answer: ConnectError"
            assert absent["open"] == "-"
            server.process.send_signal(signal.SIGSTOP)
            try:
                stopped = top(server.url, interval=0.2)[0]
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert stopped["state"] == "no answer: ReadTimeout"
            await held.call_tool("increment", {"by": 2})
            assert (await held.verify(row))["reward"] == 1.0
    assert "drained: every open episode has ended" in server.output


def test_top_on_a_terminal_redraws_a_table(folder: Path) -> None:
    with serve(folder) as server:
        text = on_a_terminal(gymhost_command("top", server.url, "--count", "2", "--interval", "0.2", "--token", TOKEN))
    assert "gymhost top" in text
    assert "calls/s" in text
    assert server.url in text
    assert "\x1b[" in text, "a terminal gets the table redrawn in place, not log lines"
    assert "state=" not in text
