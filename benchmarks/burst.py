"""A burst of concurrent requests, the way a trainer at Gym's stated scale sends them: N at once, each on a connection
of its own (verifiers opens one per call), or N keep-alive connections each sending a few requests back to back.

    python burst.py URL --requests N [--keep-alive R] [--episodes ROWS.jsonl] [--path /get_weather] [--body JSON]

Connections come from many loopback addresses (127.0.0.0/8 is this machine's), so a burst can exceed the ~28,000
ephemeral ports of one address. With ``--episodes``, each of the N is a whole episode of a written server instead
(seed with a row, two tool calls, verify), every request on a new connection. Prints one JSON object: outcomes by
kind, wall time, every latency, and this process's peak descriptors. It raises its soft open-files limit to the hard
one and refuses a burst the hard limit cannot hold: ``run.py`` splits a larger burst over several such processes
(``--first``, ``--start-at``), and adds their results up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import resource
import time
from collections import Counter

_TIMEOUT_S = 300.0  # a request waiting behind 65,536 others on two shared cores


class Connection:
    """One HTTP/1.1 connection from a source address of its own: requests and their status codes."""

    def __init__(self, host: str, port: int, source: str) -> None:
        self.host, self.port, self.source = host, port, source
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.cookie = ""

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, local_addr=(self.source, 0))

    async def post(self, path: str, body: bytes, *, close: bool) -> int:
        assert self.reader is not None
        assert self.writer is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{self.cookie}Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("closed without an answer")
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "set-cookie" and not self.cookie:
                self.cookie = f"Cookie: {value.strip().split(';', 1)[0]}\r\n"
        await self.reader.readexactly(length)
        return int(status_line.split(b" ", 2)[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _named(error: BaseException) -> str:
    """An error's kind, with its errno's name when it has one (EADDRNOTAVAIL and EMFILE are both OSError)."""
    code = getattr(error, "errno", None)
    return f"{type(error).__name__} {errno.errorcode.get(code, code)}" if code else type(error).__name__


def source(index: int) -> str:
    return f"127.{1 + index // 62500 % 200}.{index // 250 % 250}.{index % 250 + 2}"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--keep-alive", type=int, default=0, help="requests per connection (0: a connection each)")
    parser.add_argument("--path", default="/get_weather")
    parser.add_argument("--body", default='{"city": "Paris"}')
    parser.add_argument("--episodes", default=None, help="rows of a written server: play whole episodes")
    parser.add_argument("--first", type=int, default=0, help="index of this process's first request (its sources)")
    parser.add_argument("--start-at", type=float, default=0.0, help="wall-clock time to start at (several clients)")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.requests + 256
    if wanted > hard:
        raise SystemExit(f"burst.py: {args.requests} connections need {wanted} descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = args.url.removeprefix("http://").rstrip("/").split(":")
    rows = [json.loads(line) for line in open(args.episodes)] if args.episodes else []  # noqa: SIM115
    start = asyncio.Event()
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    peak_fds = 0

    async def request(connection: Connection, path: str, body: bytes, close: bool) -> None:
        began = time.perf_counter()
        try:
            status = await asyncio.wait_for(connection.post(path, body, close=close), _TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as error:
            outcomes[_named(error)] += 1
            raise
        latencies.append(time.perf_counter() - began)
        outcomes[str(status)] += 1

    async def fresh(index: int, path: str, body: bytes, cookie: str = "") -> str:
        connection = Connection(host, int(port), source(args.first + index))
        try:
            await asyncio.wait_for(connection.open(), _TIMEOUT_S)
        except (OSError, TimeoutError) as error:
            outcomes[f"connect: {_named(error)}"] += 1
            raise
        connection.cookie = cookie
        try:
            await request(connection, path, body, close=True)
        finally:
            connection.close()
        return connection.cookie

    async def one(index: int) -> None:
        await start.wait()
        with contextlib.suppress(Exception):  # a failed request is counted where it failed; the burst goes on
            if rows:
                row = rows[index % len(rows)]
                cookie = await fresh(index, "/seed_session", json.dumps(row).encode())
                for _ in range(2):
                    await fresh(index, "/gridsim_look", b"{}", cookie)
                response = {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [],
                            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
                await fresh(index, "/verify", json.dumps({**row, "response": response}).encode(), cookie)
            elif args.keep_alive:
                connection = Connection(host, int(port), source(args.first + index))
                await asyncio.wait_for(connection.open(), _TIMEOUT_S)
                try:
                    for number in range(args.keep_alive):
                        await request(connection, args.path, args.body.encode(), close=number == args.keep_alive - 1)
                finally:
                    connection.close()
            else:
                await fresh(index, args.path, args.body.encode())

    async def watch_fds() -> None:
        nonlocal peak_fds
        while True:
            peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(one(index)) for index in range(args.requests)]
    watcher = asyncio.create_task(watch_fds())
    await asyncio.sleep(max(0.2, args.start_at - time.time()))
    began = time.monotonic()
    start.set()
    await asyncio.gather(*tasks)
    wall = time.monotonic() - began
    watcher.cancel()
    print(
        json.dumps(
            {
                "outcomes": dict(outcomes),
                "wall_s": round(wall, 2),
                "latencies_ms": [round(latency * 1000, 1) for latency in latencies],
                "client_peak_fds": peak_fds,
            }
        )
    )


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
