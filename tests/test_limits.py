"""Gym's stated load, and the limits of the machine: a server started with the usual open-files limit (soft 1024)
sets itself up for thousands of connections at once, one whose hard limit is too low says so and drops nothing in
silence, and workers whose supervisor is killed free the port within seconds.

The bursts are what verifiers sends: every request on a connection of its own, all at once. They come from
several loopback addresses (127.0.0.0/8 is this machine's), as a client that needs more than one address's
ephemeral ports would send them.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from .processes import CALL_TIMEOUT_S, STATE_TIMEOUT_S, alive, children, free_port, gymhost_command, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BURST = 4096


async def burst(url: str, count: int, path: str, body: dict[str, object]) -> Counter[str]:
    """``count`` POSTs at once, each on a connection of its own (``Connection: close``): each one's HTTP status, or
    what went wrong with it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode() + payload
    start = asyncio.Event()

    async def one(index: int) -> str:
        await start.wait()
        source = (f"127.0.{index // 250 % 250}.{index % 250 + 2}", 0)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), local_addr=source), timeout=120
            )
            writer.write(request)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), timeout=120)
            writer.close()
        except (OSError, TimeoutError) as error:
            return type(error).__name__
        return answer.split(b" ", 2)[1].decode() if answer else "closed without an answer"

    tasks = [asyncio.create_task(one(index)) for index in range(count)]
    await asyncio.sleep(0.1)
    start.set()
    return Counter(await asyncio.gather(*tasks))


def limited(soft: int, hard: int, command: list[str]) -> list[str]:
    return ["prlimit", f"--nofile={soft}:{hard}", "--", *command]


async def test_a_server_started_with_the_usual_limit_raises_it_and_answers_a_burst(gym_root: Path) -> None:
    """Soft 1024 (a login's, a container's default): `gymhost serve` raises it to the hard limit (as Gym's launcher
    does, without a word on loopback), then answers 4,096 requests sent at once on 4,096 connections."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    command = limited(1024, hard, gymhost_command("serve", str(gym_root / "example_single_tool_call"), "--port", "0"))
    with serving(command) as server:
        assert open_files_limit(server.process.pid) == (hard, hard)
        statuses = await burst(server.url, BURST, "/get_weather", {"city": "Paris"})
    assert statuses == Counter({"200": BURST}), statuses
    assert "open files" not in server.output, "a routine raise is not worth a line on loopback"


@pytest.mark.parametrize("server_name", ["uvicorn", "hypercorn"])
def test_the_listen_queue_holds_the_configured_backlog_under_either_server(gym_root: Path, server_name: str) -> None:
    """A burst of connects waits in the listen queue until accepted: its length is ``ServeConfig.backlog``, as the
    kernel caps it (net.core.somaxconn), under hypercorn as under uvicorn. (hypercorn listens again on the socket it
    is given, with a backlog of its own, 100 unless told: 101 connects queued, the rest retried a second later.)"""
    from gymhost import ServeConfig

    cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
    folder = str(gym_root / "example_single_tool_call")
    with serving(gymhost_command("serve", folder, "--port", "0", "--server", server_name)) as server:
        port = server.url.rsplit(":", 1)[1]
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True)
        (line,) = listening.stdout.splitlines()
    assert int(line.split()[2]) == min(ServeConfig.backlog, cap), line  # a listening socket's Send-Q: its backlog


def open_files_limit(pid: int) -> tuple[int, int]:
    """A process's soft and hard limits of open files, as the kernel holds them."""
    limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    (line,) = [line for line in limits if line.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


async def test_a_hard_limit_too_low_is_said_and_no_connection_is_dropped_in_silence(gym_root: Path) -> None:
    """Soft and hard 1024: a burst of 3,000 connections runs the server out of descriptors, and it stops accepting
    for a moment instead of closing connections it cannot serve (they wait in the kernel's listen queue): every
    request is answered, and the server says what happened and counts it. (That the limit is too low for the
    stated load is said beyond loopback: ``test_what_limits_a_load_is_said_beyond_loopback_only``.)"""
    command = limited(1024, 1024, gymhost_command("serve", str(gym_root / "example_single_tool_call"), "--port", "0"))
    with serving(command) as server:
        statuses = await burst(server.url, 3000, "/get_weather", {"city": "Paris"})
        metrics = httpx.get(f"{server.url}/metrics", timeout=CALL_TIMEOUT_S).text
    assert statuses == Counter({"200": 3000}), statuses
    assert "cannot accept connections: this process has reached its limit of 1024 open files" in server.output
    refused = [
        line for line in metrics.splitlines() if line.startswith('gymhost_accept_errors_total{reason="descriptors"}')
    ]
    assert refused, metrics
    assert float(refused[0].rsplit(" ", 1)[1]) > 0


async def test_workers_whose_supervisor_is_killed_stop_at_once_and_free_the_port(
    gym_root: Path, tmp_path: Path
) -> None:
    """SIGKILL of the supervisor of two workers, with an episode open (a drain would wait for it): the workers stop
    within seconds, without draining for nobody, and the port is free for the server an operator starts next."""
    from gymhost.environments import awrite_folder

    from .agentenv_helpers import GRIDSIM, rows

    folder = (await awrite_folder(str(GRIDSIM), tmp_path / "root", mode="in-process", instances=2)).path
    port = free_port()
    command = gymhost_command("serve", str(folder), "--port", str(port), "--workers", "2", "--drain-timeout", "120")
    with serving(command, env={"GYMHOST_SECRET": "workers"}) as server:
        workers = children(server.process.pid)
        assert len(workers) == 2, workers
        row = rows(folder)[0]
        assert (
            httpx.post(f"{server.url}/seed_session", json=row, timeout=CALL_TIMEOUT_S).status_code == 200
        )  # an open episode
        os.kill(server.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not any(alive(pid) for pid in workers), "workers outlived their supervisor"
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))  # free: a new server can take it


@pytest.mark.parametrize(("host", "said"), [("192.0.2.1", True), ("127.0.0.1", False)])
def test_what_limits_a_load_is_said_beyond_loopback_only(host: str, said: bool) -> None:
    """The notices of a server that will listen on ``host``, with a hard limit of 1024 open files (192.0.2.1 is a
    documentation address: the notices are asked for without binding it)."""
    script = (
        "from gymhost._config import ServeConfig; from gymhost._serving._server import Server; "
        f"Server(ServeConfig(host={host!r}, backlog=10**6), say=print)._say_limits()"
    )
    done = subprocess.run(
        limited(1024, 1024, [sys.executable, "-c", script]), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    expected = [
        "WARNING: this process may open only 1024 files",
        "the listen queue holds",
    ]
    assert all(any(line.startswith(text) for line in lines) for text in expected) is said, lines
    assert said or lines == [], lines
