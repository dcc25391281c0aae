"""The server's side of the channel to an instance process, against peers that break it: every failure comes out as
the kind that means what happened (unreachable, dropped, too slow, not the protocol), the bridge's own errors come
back as they were raised, and a connection that broke is made again for the next call. The peers are real Unix
sockets; a real instance process is ``test_direct_tools``' and ``test_faults``'."""

from __future__ import annotations

import asyncio
import pickle
import pickletools
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agentenv_protocol import ToolResult

from gymhost.environments._agentenv._channel import ChannelClient, _counted, _from_instance
from gymhost.environments._backend import Catalog
from gymhost.environments._errors import (
    DataPlaneError,
    EnvDroppedError,
    EnvFailedError,
    EnvTimeoutError,
    EnvUnavailableError,
    MalformedReplyError,
)
from gymhost.environments._grading import Observation

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

Answer = Callable[[tuple[Any, str, tuple[Any, ...]], asyncio.StreamWriter], Awaitable[None]]


def frame(message: Any) -> bytes:
    payload = pickle.dumps(message)
    return struct.pack(">I", len(payload)) + payload


@asynccontextmanager
async def peer(path: Path, answer: Answer) -> AsyncIterator[list[str]]:
    """An instance's end of the channel that answers each request with ``answer``; yields the operations seen."""
    seen: list[str] = []

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                request = pickle.loads(await reader.readexactly(size))
                seen.append(request[1])
                await answer(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(connected, path=str(path))
    try:
        yield seen
    finally:
        server.close()


def client(path: Path, timeout: float = 5.0) -> ChannelClient:
    return ChannelClient(str(path), base_url="http://instance-0", data_timeout=timeout)


async def test_the_bridges_errors_come_back_as_raised_and_others_as_malformed(tmp_path: Path) -> None:
    answers = {
        "clear": (None, True, None),
        "state": (None, False, ("DataPlaneError", "data/get failed: nope", None)),
        "begin": (None, False, ("EnvFailedError", "deploy failed", "openenv:environment_error")),
        "describe": (None, False, (None, "RuntimeError: boom", None)),
        "grade": (None, False, ("SystemExit", "not ours", None)),
    }

    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        request_id, operation, _ = request
        writer.write(frame((request_id, *answers[operation][1:])))

    async with peer(tmp_path / "0.sock", answer):
        channel = client(tmp_path / "0.sock")
        assert await channel.call("clear") is None
        with pytest.raises(DataPlaneError, match="data/get failed: nope"):
            await channel.state()
        with pytest.raises(EnvFailedError) as failed:
            await channel.call("begin", None)
        assert failed.value.kind == "openenv:environment_error"
        with pytest.raises(MalformedReplyError, match="the instance raised RuntimeError: boom"):
            await channel.describe()
        with pytest.raises(MalformedReplyError, match="not ours"):
            await channel.call("grade")
        await channel.aclose()


async def test_a_frame_that_is_not_one_fails_the_call_as_malformed_and_the_next_call_reconnects(tmp_path: Path) -> None:
    broken = [True]

    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        if broken.pop() if broken else False:
            writer.write(struct.pack(">I", 8) + b"not one!")
        else:
            writer.write(frame((request[0], True, "fine")))

    async with peer(tmp_path / "0.sock", answer) as seen:
        channel = client(tmp_path / "0.sock")
        with pytest.raises(MalformedReplyError, match="a frame that is not a message"):
            await channel.call("state")
        assert await channel.call("state") == "fine"
        assert seen == ["state", "state"]
        await channel.aclose()


def _answering_more_than_the_server_builds(request_id: int, kind: str) -> bytes:
    """``(request_id, True, value)``, where value is 2 MiB of empty dicts (an opcode of one byte each, 64 bytes of
    dict), or an empty list put in memo slot 10,000,000 (seven bytes; the unpickler grows its memo to twice that)."""
    built = b"(" + b"}" * (2 * 1024 * 1024) + b"l" if kind == "opcodes" else b"]r" + struct.pack("<I", 10_000_000)
    payload = b"\x80\x04J" + struct.pack("<i", request_id) + b"\x88" + built + b"\x87."
    return struct.pack(">I", len(payload)) + payload


async def test_an_answer_standing_for_more_than_the_server_builds_or_walks_is_malformed(tmp_path: Path) -> None:
    """Hosted code writes what it likes on its channel: a pickle's memo lets a few hundred bytes stand for 2**60
    values, which the server would walk for as long as the machine lasts; an opcode of one byte builds a dict of
    64, so a frame within the size limit would take many times its size in memory; and a memo slot named in seven
    bytes grows the memo to twice its number. Each is refused as a malformed reply, within a bound of the server's
    memory, and the next call is answered."""
    bomb: list[Any] = []
    for _ in range(60):
        bomb = [bomb, bomb]
    answers = iter(["memo", "opcodes", "slot", "fine"])

    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        kind = next(answers)
        if kind in ("opcodes", "slot"):
            writer.write(_answering_more_than_the_server_builds(request[0], kind))
        else:
            writer.write(frame((request[0], True, bomb if kind == "memo" else kind)))

    async with peer(tmp_path / "0.sock", answer):
        channel = client(tmp_path / "0.sock")
        with pytest.raises(MalformedReplyError, match="an answer of more than 1000000 values"):
            await channel.call("state")
        tracemalloc.start()
        try:
            with pytest.raises(MalformedReplyError, match="an answer of more than 1000000 values"):
                await channel.call("state")
            with pytest.raises(MalformedReplyError, match=r"an answer with the opcode b'r', which no answer has"):
                await channel.call("state")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 32 * 1024 * 1024, f"{peak / 2**20:.0f} MiB to refuse frames of 2 MiB and of 14 bytes"
        assert await channel.call("state") == "fine"
        await channel.aclose()


def test_every_answer_an_instance_sends_is_read_as_the_unpickler_reads_it() -> None:
    """The server walks each frame before it unpickles it, skipping each opcode's argument by its size: every kind of
    value an honest answer is made of passes, counted opcode by opcode as pickletools counts them (a size misread
    would let the unpickler run bytes the walk skipped), and an opcode no answer has is refused."""
    tool_result = ToolResult.model_validate(
        {
            "content": [
                {"type": "text", "text": "é" * 300},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            ],
            "isError": True,
            "structuredContent": {"n": [0, 255, 65535, 2**31, -(2**80), 2.5, None, True, False, b"x" * 300]},
        }
    )
    observation = Observation(
        state={"pos": [1, 2], "deep": {"t": (1, 2, 3, 4), "s": {1, 2}, "f": frozenset({"a"})}},
        extension_scores={2: 1.0, 3: 0.5},
        environment=(0.5, "a" * 70_000),
    )
    answers = [
        tool_result,
        Catalog("gridsim", card={"tools": [{"name": "move"}] * 3}),
        observation,
        ("EnvFailedError", "deploy failed", "openenv:environment_error"),
        "x" * (2 * 1024 * 1024),  # past a frame's first 64 KiB: pickle's FRAME opcode
        [[]] * 3,  # the memo
    ]
    for number, value in enumerate(answers, 1):
        payload = pickle.dumps((number, True, value), protocol=pickle.HIGHEST_PROTOCOL)
        opcodes = sum(1 for _ in pickletools.genops(payload))
        assert _counted(memoryview(payload)) == opcodes, value
        assert _from_instance(memoryview(payload)) == (number, True, value)
    for refused in (pickle.dumps((1, True, None), protocol=0), b"\x80\x04]r\x00\x00\x00\x01."):
        with pytest.raises(pickle.UnpicklingError, match="which no answer has"):
            _counted(memoryview(refused))


async def test_a_peer_that_closes_mid_call_is_dropped_and_one_that_never_answers_times_out(tmp_path: Path) -> None:
    async def hang_up(request: Any, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with peer(tmp_path / "0.sock", hang_up):
        with pytest.raises(EnvDroppedError, match="dropped mid-call"):
            await client(tmp_path / "0.sock").call("clear")

    async def never(request: Any, writer: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    async with peer(tmp_path / "1.sock", never):
        with pytest.raises(EnvTimeoutError, match=r"clear did not answer within 0.2s"):
            await client(tmp_path / "1.sock", timeout=0.2).call("clear")


async def test_nobody_listening_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(EnvUnavailableError):
        await client(tmp_path / "missing.sock").describe()


async def test_calls_in_flight_together_each_get_their_own_answer(tmp_path: Path) -> None:
    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        request_id, _, (delay,) = request

        async def later() -> None:
            await asyncio.sleep(delay)
            writer.write(frame((request_id, True, delay)))

        asyncio.get_running_loop().create_task(later())

    async with peer(tmp_path / "0.sock", answer):
        channel = client(tmp_path / "0.sock")
        delays = [0.3, 0.1, 0.2, 0.0]
        assert await asyncio.gather(*(channel.call("state", delay) for delay in delays)) == delays
        await channel.aclose()
