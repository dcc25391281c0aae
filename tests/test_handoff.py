"""Handing a connection to the worker that owns its session (``gymhost serve --workers N``): the owner is read from
the request head without consuming it, the connection itself goes to the owner, which reads the request as if it had
accepted it and answers the client; what cannot be handed over (no owner in the head, a head in pieces, an owner
that is not there) is served where it landed, to be forwarded as before, and counted. Real sockets and a real event
loop in one process: the two "workers" are two acceptors."""

from __future__ import annotations

import asyncio
import json
import socket
import tempfile
from base64 import b64encode
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import itsdangerous
import pytest
from prometheus_client import REGISTRY

from gymhost._serving import _handoff
from gymhost._serving._accepting import Acceptor
from gymhost._serving._handoff import HandOffReceiver
from gymhost._sessions._identity import process_state
from gymhost._sessions._owner import OWNER_KEY, head_owner
from gymhost._sessions._signing import _SALT, OwnedSerializer

from .processes import CALL_TIMEOUT_S, STATE_TIMEOUT_S

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

REPLICA = "replica-under-test"


def owner(worker: int) -> dict[str, Any]:
    return {"replica": REPLICA, "worker": worker, "start": "s"}


def cookie(worker: int) -> str:
    """A session cookie as ``GymSessionMiddleware`` signs it."""
    payload = b64encode(json.dumps({"session_id": "x", OWNER_KEY: owner(worker)}).encode())
    return itsdangerous.TimestampSigner("secret", salt="gymhost.session:").sign(payload).decode()


def token(worker: int) -> str:
    """An MCP session token as gymhost mints it (the owner in an envelope around Gym's payload)."""
    process_state_owner = process_state.owner
    try:
        process_state.owner = lambda: owner(worker)  # type: ignore[method-assign]
        return str(OwnedSerializer("secret", salt=_SALT).dumps({"session_id": "x"}))
    finally:
        process_state.owner = process_state_owner  # type: ignore[method-assign]


def head(*headers: str, method: str = "POST") -> bytes:
    return "\r\n".join([f"{method} /gridsim_move HTTP/1.1", "host: gymhost", *headers, "", ""]).encode()


def test_the_owner_is_read_from_a_cookie_or_a_token() -> None:
    assert head_owner(head(f"Cookie: other=1; GridSim___gridsim={cookie(1)}")) == owner(1)
    assert head_owner(head(f'cookie: GridSim___gridsim="{cookie(1)}"')) == owner(1)
    assert head_owner(head(f"x-nemo-gym-session-token: {token(1)}")) == owner(1)
    # the token first, as SessionOwnershipMiddleware reads them
    assert head_owner(head(f"Cookie: a={cookie(0)}", f"X-Nemo-Gym-Session-Token: {token(1)}")) == owner(1)


def test_no_owner_where_the_head_does_not_name_one() -> None:
    assert head_owner(head(f"Cookie: a={cookie(1)}", method="GET")) is None, "only POSTs are routed by session"
    assert head_owner(head(f"Cookie: a={cookie(1)}")[:-2]) is None, "a head not yet whole"
    assert head_owner(head("Cookie: a=1.2.3; b=not-base64.x.y", "x-nemo-gym-session-token: garbage")) is None
    assert head_owner(head()) is None


class Worker:
    """One worker's public acceptor (handing off) and hand-off receiver, each connection answered with its name."""

    def __init__(self, index: int, listening: socket.socket, folder: Path) -> None:
        self.index, self.served = index, 0
        loop = asyncio.get_running_loop()
        self.acceptor = Acceptor(loop, listening, self.protocol, hand_off=True)
        path = folder / f"worker-{index}.handoff"
        self.hand_off = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.hand_off.bind(str(path))
        self.hand_off.listen(4)
        self.receiver = HandOffReceiver(loop, self.hand_off, self.acceptor.serve)

    def protocol(self) -> asyncio.Protocol:
        worker = self

        class Answer(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.transport, self.data = transport, b""

            def data_received(self, data: bytes) -> None:
                self.data += data
                if self.data.endswith(b"\r\n\r\n"):  # the whole request, as the client sent it, read here
                    worker.served += 1
                    body = f"worker {worker.index}".encode()
                    self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                    self.transport.close()

        return Answer()


@pytest.fixture
def workers_dir() -> Iterator[Path]:
    """The workers' folder, short: a Unix socket's path has at most 107 bytes, and pytest's ``tmp_path`` under the run's
    temporary folder, with a long test name, can pass it."""
    with tempfile.TemporaryDirectory(prefix="handoff-") as folder:
        yield Path(folder)


@asynccontextmanager
async def worker_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Worker, int]]:
    """Worker 0 of a replica, accepting on a loopback port, with a sibling worker 1 that accepts nothing itself."""
    monkeypatch.setattr(process_state, "replica", REPLICA)
    monkeypatch.setattr(process_state, "worker", 0)
    monkeypatch.setattr(process_state, "workers_dir", str(tmp_path))
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(16)
    zero = Worker(0, listening, tmp_path)
    one = Worker(1, socket.socket(), tmp_path)
    zero.acceptor.start()
    one.receiver.start()
    try:
        yield zero, listening.getsockname()[1]
    finally:
        for part in (zero.acceptor, one.receiver, one.acceptor, zero.receiver):
            part.close()
        listening.close()


async def request(port: int, request_head: bytes, pause: float = 0.0, before: float = 0.0) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(before)  # connected, and nothing sent yet
    if pause:  # the head in two pieces, as a slow client sends it
        writer.write(request_head[:20])
        await writer.drain()
        await asyncio.sleep(pause)
        writer.write(request_head[20:])
    else:
        writer.write(request_head)
    answer = await asyncio.wait_for(reader.read(), CALL_TIMEOUT_S)
    writer.close()
    return answer.decode().rpartition("\r\n\r\n")[2]


def handoffs(outcome: str) -> float:
    return REGISTRY.get_sample_value("gymhost_handoffs_total", {"outcome": outcome}) or 0.0


async def test_a_connection_goes_to_the_worker_owning_its_session(
    workers_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = handoffs("sent")
    async with worker_zero(workers_dir, monkeypatch) as (zero, port):
        assert await request(port, head(f"Cookie: GridSim___gridsim={cookie(1)}")) == "worker 1"
        assert await request(port, head(f"x-nemo-gym-session-token: {token(1)}")) == "worker 1"
        assert await request(port, head(f"Cookie: GridSim___gridsim={cookie(0)}")) == "worker 0", "its own"
        assert await request(port, head()) == "worker 0", "no session yet: a seed starts its episode here"
        # accepted before it sent anything: the peek waits for the head
        assert await request(port, head(f"Cookie: a={cookie(1)}"), before=0.2) == "worker 1"
    assert handoffs("sent") == sent + 3
    assert zero.served == 2


async def test_what_cannot_be_handed_over_is_served_where_it_landed(
    workers_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_handoff, "_WAIT_S", 0.1)
    async with worker_zero(workers_dir, monkeypatch) as (zero, port):
        # silent past the wait: served here, where the server's own protocol reads it when it comes
        assert await request(port, head(f"Cookie: a={cookie(1)}"), before=0.3) == "worker 0"
        # a head in pieces names no owner in its first segment: served here (and forwarded, in a real worker)
        assert await request(port, head(f"Cookie: a={cookie(1)}"), pause=0.2) == "worker 0"
        gone = handoffs("owner_gone")
        (workers_dir / "worker-1.handoff").unlink()  # worker 1 is gone: its socket with it
        zero.acceptor._hand_off.close()  # type: ignore[union-attr]  # (and the connection worker 0 kept to it)
        assert await request(port, head(f"Cookie: a={cookie(1)}")) == "worker 0"
        assert handoffs("owner_gone") == gone + 1
    assert zero.served == 3


async def test_a_sibling_too_busy_to_take_a_connection_leaves_it_served_here(
    workers_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling that takes nothing from its hand-off socket (stuck, or under a burst) fills it: the connections
    past what the socket holds are served where they landed (forwarded, in a real worker), each counted. Those it
    holds end with it, as the requests a stuck worker holds do."""
    monkeypatch.setattr(process_state, "replica", REPLICA)
    monkeypatch.setattr(process_state, "worker", 0)
    monkeypatch.setattr(process_state, "workers_dir", str(workers_dir))
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(str(workers_dir / "worker-1.handoff"))
    stuck.listen(4)  # connected to, never read
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1024)
    zero = Worker(0, listening, workers_dir)
    zero.acceptor.start()
    busy, sent = handoffs("owner_busy"), handoffs("sent")
    port = listening.getsockname()[1]
    try:

        async def answered() -> str:
            try:
                return await request(port, head(f"Cookie: a={cookie(1)}"))
            except ConnectionResetError:  # closed unread, with the sibling
                return ""

        calls = [asyncio.create_task(answered()) for _ in range(600)]
        routed = asyncio.get_running_loop().time() + STATE_TIMEOUT_S
        while handoffs("owner_busy") - busy + handoffs("sent") - sent < len(calls):  # each, one way or the other
            assert asyncio.get_running_loop().time() < routed, "connections were left unrouted"
            await asyncio.sleep(0.1)
        stuck.close()  # the sibling gone: what it held is closed
        answers = await asyncio.gather(*calls)
    finally:
        zero.acceptor.close()
        listening.close()
    served_here = answers.count("worker 0")
    assert 0 < served_here < len(answers), "the sibling's socket held some connections, not all"
    assert handoffs("owner_busy") - busy == served_here == zero.served
    assert handoffs("sent") - sent == answers.count("") == len(answers) - served_here
