"""The server's side of the channel to an instance process, against peers that break it: every failure comes out as
the kind that means what happened (unreachable, dropped, too slow, not the protocol), the bridge's own errors come
back as they were raised, and a connection that broke is made again for the next call. The peers are real Unix
sockets; a real instance process is ``test_direct_tools``' and ``test_faults``'."""

from __future__ import annotations

import asyncio
import json
import pickle
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agentenv_protocol import ToolResult

from gymhost.environments._agentenv._channel import _ANSWERS, ChannelClient, _from_instance, _to_server
from gymhost.environments._backend import Catalog
from gymhost.environments._errors import (
    DataPlaneError,
    EnvDroppedError,
    EnvFailedError,
    EnvTimeoutError,
    EnvUnavailableError,
    MalformedReplyError,
)
from gymhost.environments._grading import Asked, Observation
from gymhost.environments._tasks import ExtensionCriterion

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

Answer = Callable[[tuple[Any, str, tuple[Any, ...]], asyncio.StreamWriter], Awaitable[None]]


def frame(message: Any) -> bytes:
    """An instance's answer as it writes one: JSON."""
    payload = json.dumps(message).encode()
    return struct.pack(">I", len(payload)) + payload


@asynccontextmanager
async def peer(path: Path, answer: Answer, ended: asyncio.Queue[None] | None = None) -> AsyncIterator[list[str]]:
    """An instance's end of the channel that answers each request with ``answer``; yields the operations seen.
    ``ended`` is told of each connection the server ends."""
    seen: list[str] = []

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                request = pickle.loads(await reader.readexactly(size))
                seen.append(request[1])
                await answer(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            if ended is not None:
                ended.put_nowait(None)
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


class _Escape:
    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, ("raise SystemExit('ran in the server')",))


async def test_an_answer_is_read_as_data_never_run_nor_built_past_its_bound(tmp_path: Path) -> None:
    """Hosted code writes what it likes on its channel: a pickle that names a callable (which unpickling would call),
    4.5 million empty arrays (three bytes of text, 64 of memory each), or data that is not the operation's answer.
    Each is refused as a malformed reply, within a bound of the server's memory, and the next call is answered."""
    answers = iter(["pickle", "arrays", "not a catalog", "fine"])

    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        kind = next(answers)
        if kind == "pickle":
            payload = pickle.dumps((request[0], True, _Escape()))
            writer.write(struct.pack(">I", len(payload)) + payload)
        elif kind == "arrays":
            payload = b"[%d,true,[" % request[0] + b"[]," * 4_500_000 + b"[]]]"
            writer.write(struct.pack(">I", len(payload)) + payload)
        else:
            writer.write(frame([request[0], True, {"name": "x"} if kind == "not a catalog" else kind]))

    async with peer(tmp_path / "0.sock", answer):
        channel = client(tmp_path / "0.sock")
        with pytest.raises(MalformedReplyError, match="a frame that is not a message"):
            await channel.call("state")
        tracemalloc.start()
        try:
            with pytest.raises(MalformedReplyError, match="an answer of more than 4000000 arrays and objects"):
                await channel.call("state")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024 * 1024, f"{peak / 2**20:.0f} MiB to refuse a frame of 13 MiB"
        with pytest.raises(MalformedReplyError, match="describe answered not a catalog"):
            await channel.describe()
        assert await channel.call("state") == "fine"
        await channel.aclose()


def test_every_answer_an_instance_sends_reads_back_as_it_was() -> None:
    """What an instance answers crosses as JSON and is read back, by the operation it answers, as the same value:
    tool results with text and images, catalogs, observations (their scores' indexes are a JSON object's keys),
    names, tools, a session's id, flags, data. A score's index that is not a few digits is refused (ints' hashes
    are themselves: keys of any size could be made to collide)."""
    tool_result = ToolResult.model_validate(
        {
            "content": [
                {"type": "text", "text": "é" * 300},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            ],
            "isError": True,
        }
    )
    catalog = Catalog("gridsim", tools=({"name": "move", "inputSchema": {}},), hidden=frozenset({"b", "a"}), card={})
    answers: list[tuple[str, Any]] = [
        ("call_tool", tool_result),
        ("describe", (catalog, True)),
        ("observe", Observation(state={"pos": [1, 2]}, extension_scores={2: 1.0, 13: 0.5}, environment=(0.5, "a"))),
        ("observe", Observation(state=None)),
        ("hidden_tools", {"b", "a"}),
        ("list_tools", [{"name": "move"}]),
        ("open", "0123abcd"),
        ("ready", False),
        ("state", {"grid": [[0, 1]], "done": False}),
        ("clear", None),
    ]
    for number, (operation, value) in enumerate(answers, 1):
        request_id, ok, read = _from_instance(memoryview(_to_server((number, True, value))))
        assert (request_id, ok, _ANSWERS[operation](read)) == (number, True, value), operation
    for index in (str(2**61 - 1), " 2", "1_0", "\u0663", "-1"):
        with pytest.raises(ValueError, match="an extension score's index that is not one"):
            _ANSWERS["observe"]({"state": None, "scores": {index: 1.0}, "environment": None})


async def test_a_verify_sends_the_instance_only_the_card_entries_its_grading_calls(tmp_path: Path) -> None:
    """The card is hosted code's, of any size the describe allows: a verify copies to the instance the entries of
    the extensions its criteria call, and nothing of it for a task graded by state alone."""
    grade = {"uri": "urn:x:grade/v1", "params": {"methods": {"grade": {"endpoint": "/grade", "method": "POST"}}}}
    other = {"uri": "urn:x:other/v1", "padding": "x" * 100_000}
    catalog = Catalog("x", card={"capabilities": {"extensions": [other, grade], "tools": [{"name": "move"}]}})
    by_extension = Asked(state=True, extensions={0: ExtensionCriterion(kind="extension", uri=grade["uri"])}, tools=None)
    by_state = Asked(state=True, extensions={}, tools=None)
    sent: list[Catalog] = []

    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        sent.append(request[2][0])
        writer.write(frame((request[0], True, {"state": None, "scores": {}, "environment": None})))

    async with peer(tmp_path / "0.sock", answer):
        channel = client(tmp_path / "0.sock")
        await channel.observe(catalog, by_extension, "")
        await channel.observe(catalog, by_state, "")
        await channel.aclose()
    assert [dict(catalog.card) for catalog in sent] == [{"capabilities": {"extensions": [grade]}}, {}]


async def test_answers_nobody_asked_are_skipped_unread_and_a_message_not_an_answer_breaks_its_connection(
    tmp_path: Path,
) -> None:
    """An answer to no call in flight (one that came after its call timed out, or hosted code's) is skipped without
    being parsed (here one that would be refused, were it read): it could be 16 MiB for the server to read, as
    often as the instance liked. A message that is not
    ``[id, ok, value]`` breaks its connection, and the next call makes another; so does a notice (which the instance
    says unasked, as it ends) longer than gymhost's own."""
    answers = iter(["unasked then fine", "not an answer", "fine", "a long notice"])
    ended: asyncio.Queue[None] = asyncio.Queue()

    async def answer(request: Any, writer: asyncio.StreamWriter) -> None:
        kind = next(answers)
        if kind == "unasked then fine":
            payload = b"[999,true,[" + b"[]," * 4_500_000 + b"[]]]"  # refused, were it read
            writer.write(struct.pack(">I", len(payload)) + payload)
        if kind == "a long notice":  # gymhost's own are a few hundred bytes
            writer.write(frame([0, False, ["InstanceLimitError", "x" * 100_000, "provider_oom_killed"]]))
            return
        writer.write(frame([request[0], True] if kind == "not an answer" else [request[0], True, "fine"]))

    async with peer(tmp_path / "0.sock", answer, ended):
        channel = client(tmp_path / "0.sock")
        assert await channel.call("state") == "fine"
        with pytest.raises(MalformedReplyError, match=r"an answer that is not \(id, ok, value\)"):
            await channel.call("state")
        async with asyncio.timeout(30):  # (a bound on a failure, not a wait: it ends as the connection does)
            await ended.get()  # the connection that said it, ended by the server
        assert await channel.call("state") == "fine"
        with pytest.raises(MalformedReplyError, match="a notice of more than 65536 bytes"):
            await channel.call("state")
        await channel.aclose()


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
