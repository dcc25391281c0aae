"""The private channel between a server and the instance processes it forked: no HTTP, no MCP wire in between.

An instance process (``_template``) runs its environment as an in-process instance runs it in the server: the
environment's app with its lifespan, the card and the data plane through an in-memory ASGI transport, tool calls on
its MCP server object (``_direct``). What crosses the process boundary is a call of the bridge's own interface
(``InstanceClient``, ``ToolSession``) and its answer, so what the environment sees and answers is what it sees
in-process, and the server's side of a tool call is one small message each way instead of an HTTP request with an
SSE reply and JSON-RPC text parsed on both sides.

Frames are a 4-byte big-endian length and a message. The server writes pickles: its own values (a task's seed and
what its grading asks, a tool call's arguments), carried with no conversion, to a peer that is the same gymhost and
Python; the socket lives in a folder only this user can open. An instance writes JSON: it runs code gymhost did not
write, which may write anything on its own channel, and a pickle names callables that unpickling calls, while its
opcodes let a few bytes make the reader build gigabytes or hash for hours. The server reads each answer as data
(``_from_instance``: its arrays and objects counted before it is parsed), as the operation it answers
(``_ANSWERS``: a tool result, a catalog, an observation, built from fields whose form is checked), and checks what
grading reads before it grades (``Observation.answering``).
A request is ``(id, operation, arguments)``; an answer is ``(id, True, value)`` or ``(id, False, (error class name,
message, kind))``: the errors are the bridge's own (``_errors``, of a kind ``_outcomes`` knows), raised again in the
server as they were raised in the instance, and anything else is answered as a malformed reply. Several calls may
be in flight on one connection (a tool call, and the pool reading the state).
An instance that reached one of its limits says so unasked, on every connection, just before it ends: a notice,
``(0, False, ("InstanceLimitError", message, failure_kind))``, which fails every call in flight and every later one
(``end_for_limit``).

Failures keep their meaning: a socket nobody listens on is ``EnvUnavailableError``, a connection that drops with a
call in flight ``EnvDroppedError``, no answer in time ``EnvTimeoutError``, a frame that is not one
``MalformedReplyError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import pickle
import re
import socket
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, cast

from agentenv_protocol import ToolResult
from agentenv_protocol.client import find_extension

from ..._confinement import Reached
from ..._exceptions import GymhostError
from .. import _errors
from .._backend import Catalog, ToolSession
from .._errors import (
    EnvDroppedError,
    EnvTimeoutError,
    EnvUnavailableError,
    InstanceLimitError,
    MalformedReplyError,
    McpSessionError,
)
from .._grading import Asked, Observation
from .._outcomes import KNOWN_KINDS
from .._tasks import Seed
from ._eager import start_eagerly

__all__ = ["ChannelClient", "Copies", "end_for_limit", "listen_at", "serve_instance"]

logger = logging.getLogger("gymhost.environments")

_HEADER = struct.Struct(">I")
_MAX_FRAME = 256 * 1024 * 1024  # what the server sends an instance (a task's seed, a tool call's arguments)
# What an instance answers: a tool result can be large (a file, a screenshot), but a frame of JSON can build sixteen
# times its size in memory (one-character strings) and take half a second to parse at this size, so less than the
# server's own. An instance's larger answer is answered as an error there.
_MAX_ANSWER = 16 * 1024 * 1024
# The arrays and objects an answer holds (an honest one: a few dozen; a tool's text holding a JSON table, counted too,
# many): 64 bytes each at most, about what a frame of _MAX_ANSWER builds of strings.
_MAX_CONTAINERS = 4_000_000
_MAX_NOTICE = 64 * 1024  # what an instance says unasked: gymhost's own few hundred bytes
_MAX_SAID = 4000  # the characters of an instance's error message kept (it becomes a failure_reason, a log line)
_ANSWER_ID = re.compile(rb"\[(\d{1,18}),")  # how an instance's answer begins: ``[id,``
_UNASKED = object()  # an answer nobody waits for, skipped unread
_MARGIN_S = 1.0  # the instance times its own tool calls out; the server waits this much longer before it does
_ANY_CATALOG = Catalog("")  # the catalog an instance process opens its own tool sessions with (they are direct)
_NOTICE = 0  # the request id of what an instance says unasked; a call's ids start at 1
_LIMIT_EXIT = 70  # the status an instance that reached a limit ends with (EX_SOFTWARE)
_ENDED_WAIT_S = 1.0  # how long the server waits, once an instance has exited, for the rest of what it said


def _to_instance(message: Any) -> bytes:
    """The server's message to an instance: a pickle, carried with no conversion (the server's own values)."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _from_server(frame: memoryview) -> Any:
    return pickle.loads(frame)


def _to_server(message: Any) -> bytes:
    """An instance's message to the server, as JSON: tool results, catalogs and observations as their fields, sets
    as sorted lists, a dict's int keys as text (``_ANSWERS`` reads each back as the operation's answer)."""
    # (UTF-8 as is: escaped, a CJK character took 6 bytes of the limit; a lone surrogate as its bytes, as json reads)
    payload = json.dumps(message, default=_plain, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    if len(payload) > _MAX_ANSWER:
        raise ValueError(f"an answer of {len(payload)} bytes, past the limit of {_MAX_ANSWER}")
    return payload


def _plain(value: Any) -> Any:
    if isinstance(value, ToolResult):
        return value.model_dump(mode="json")
    if isinstance(value, Catalog):
        return {"name": value.name, "tools": list(value.tools), "hidden": sorted(value.hidden), "card": value.card}
    if isinstance(value, Observation):
        return {"state": value.state, "scores": value.extension_scores, "environment": value.environment}
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a {type(value).__name__} is not JSON")


def _from_instance(frame: memoryview) -> Any:
    """An instance's frame, read as JSON: data, never code (a pickle names callables, which unpickling calls, and
    its opcodes let a few bytes make the server build gigabytes or hash for hours). Its arrays and objects are
    counted in the text before it is parsed (an empty array: three bytes of text, 64 of memory)."""
    data = frame.tobytes()
    if data.count(b"[") + data.count(b"{") > _MAX_CONTAINERS:
        raise ValueError(f"an answer of more than {_MAX_CONTAINERS} arrays and objects")
    return json.loads(data)


# What each operation's answer is read as: its form checked, the bridge's own values built from its fields.
def _nothing(value: Any) -> None:
    return None


def _data(value: Any) -> Any:
    return value  # JSON, as an environment's data plane answers it


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"a {type(value).__name__}, not true or false")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a {type(value).__name__}, not text")
    return value


def _index(key: str) -> int:
    """An extension criterion's index, a JSON object's key: a few ASCII digits (an int's hash is itself, so keys
    of any size could all be made to collide, and every insert would take as long as the dict is large)."""
    if not (key.isascii() and key.isdigit() and len(key) <= 9):
        raise ValueError("an extension score's index that is not one")
    return int(key)


def _names(value: Any) -> set[str]:
    if not (isinstance(value, list) and all(isinstance(name, str) for name in value)):
        raise ValueError("not a list of names")
    return set(value)


def _tools(value: Any) -> list[dict[str, Any]]:
    if not (isinstance(value, list) and all(isinstance(tool, dict) for tool in value)):
        raise ValueError("not a list of tools")
    return value


def _read_by(asked: Asked, catalog: Catalog) -> Catalog:
    """What of ``catalog`` an observation reads (``_grader.observe``): the card's entries for the extensions its
    criteria call, none for a task graded by state alone. Not the whole card at every verify: hosted code writes
    the card, and its size would be the server's to copy each time."""
    if not asked.extensions:
        return _ANY_CATALOG
    card = dict(catalog.card)
    called = (find_extension(card, uri) for uri in {criterion.uri for criterion in asked.extensions.values()})
    return Catalog(catalog.name, card={"capabilities": {"extensions": [entry for entry in called if entry]}})


def _catalog(value: Any) -> Catalog:
    if not isinstance(value, dict) or set(value) != {"name", "tools", "hidden", "card"}:
        raise ValueError("not a catalog")
    if not isinstance(value["card"], dict):
        raise ValueError("a catalog whose card is not an object")
    return Catalog(
        _text(value["name"]), tuple(_tools(value["tools"])), frozenset(_names(value["hidden"])), value["card"]
    )


def _described(value: Any) -> tuple[Catalog, bool]:
    if not (isinstance(value, list) and len(value) == 2):
        raise ValueError("not a catalog and a flag")
    return _catalog(value[0]), _flag(value[1])


def _observation(value: Any) -> Observation:
    if not isinstance(value, dict) or set(value) != {"state", "scores", "environment"}:
        raise ValueError("not an observation")
    scores, environment = value["scores"], value["environment"]
    if not isinstance(scores, dict):
        raise ValueError("extension scores that are not an object")
    if environment is not None and not (isinstance(environment, list) and len(environment) == 2):
        raise ValueError("an environment's reward that is not a number and its account")
    return Observation(
        state=value["state"],
        extension_scores={_index(index): score for index, score in scores.items()},  # (what they are: answering's)
        environment=tuple(environment) if environment is not None else None,  # type: ignore[arg-type]
    )


_ANSWERS: dict[str, Callable[[Any], Any]] = {
    "call_tool": ToolResult.model_validate,
    "ready": _flag,
    "describe": _described,
    "hidden_tools": _names,
    "clear": _nothing,
    "state": _data,
    "begin": _nothing,
    "observe": _observation,
    "open": _text,
    "list_tools": _tools,
    "close": _nothing,
}


class _Framed(asyncio.Protocol):
    """Length-prefixed messages on a stream, each handed to ``on_message``; ``on_lost`` once, when it ends."""

    def __init__(
        self,
        on_message: Callable[[Any], None],
        on_lost: Callable[[BaseException | None], None],
        *,
        loads: Callable[[memoryview], Any],
        dumps: Callable[[Any], bytes],
        max_frame: int,
    ) -> None:
        """``loads`` and ``dumps``: how a frame is read and written (the server writes pickles and reads JSON,
        ``_from_instance``; an instance the other way round); ``max_frame``: past this size, the peer is broken."""
        self._loads = loads
        self._dumps = dumps
        self._max_frame = max_frame
        self._on_message = on_message
        self._on_lost: Callable[[BaseException | None], None] | None = on_lost
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's are not asyncio's classes, but are ones

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buffer)
            if size > self._max_frame:
                self._broken(MalformedReplyError(f"a frame of {size} bytes, past the limit of {self._max_frame}"))
                return
            end = _HEADER.size + size
            if len(buffer) < end:
                return
            try:
                message = self._loads(memoryview(buffer)[_HEADER.size : end])
            except Exception as error:
                self._broken(MalformedReplyError(f"a frame that is not a message: {error!r}"))
                return
            del buffer[:end]
            self._on_message(message)
            if self._on_lost is None:  # broken by what it said
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(exc)

    def _lose(self, error: BaseException | None) -> None:
        """``on_lost``, once: a broken frame ends the connection, whose end is then reported again."""
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost(error)

    def send(self, message: Any) -> None:
        if self.transport is None or self.transport.is_closing():
            raise EnvDroppedError("the instance's channel is closed")
        payload = self._dumps(message)
        self.transport.write(_HEADER.pack(len(payload)) + payload)

    def _broken(self, error: BaseException) -> None:
        self._buffer = bytearray()  # (not cleared in place: the error may still hold a view of it)
        self._lose(error)
        if self.transport is not None:
            self.transport.abort()


# -- the server's side ---------------------------------------------------------------------------------------------


_READING = frozenset({"ready", "describe", "state"})  # what leaves an instance as it was (hidden_tools opens a session)


class Copies:
    """What the instances forked from one constructed environment share: its catalog, read from the first of them.
    Each other answers describe with it (``ChannelClient``), once it answers at all: a start then costs no catalog
    built in the instance and read here (a third of a start's CPU, measured in benchmarks/README.md)."""

    def __init__(self) -> None:
        self.catalog: Catalog | None = None


class ChannelClient:
    """One instance process, as the bridge talks to it (``InstanceClient``), over its channel socket. The connection
    is made on first use and again after it drops (the pool's describe is what waits for a starting instance)."""

    def __init__(self, path: str, *, base_url: str, data_timeout: float, copies: Copies | None = None) -> None:
        """``copies``: the instance is a copy of others (forked from one constructed environment), which share
        their catalog there."""
        self.path = path
        self.base_url = base_url
        self.data_timeout = data_timeout
        self._copies = copies
        self._protocol: _Framed | None = None
        self._connecting: asyncio.Lock | None = None
        self._pending: dict[int, tuple[asyncio.Future[Any], str]] = {}  # by request id: the answer, the operation
        self._ids = itertools.count(1)
        self._sessions = itertools.count(1)
        self.ended_by: InstanceLimitError | None = None  # the limit the instance said it reached, as it ended
        # The instance reset its environment as it started, and nothing has been asked of it since: the pool's
        # clear before its first episode is already done (``_template``). Once anything else was asked, never again.
        self._reset = False
        self._touched = False
        self._closed: asyncio.Event | None = None  # set when the connection ends

    async def describe(self) -> Catalog:
        copies = self._copies
        if copies is not None and copies.catalog is not None:
            reset = await self.call("ready")
            self._reset = reset is True and not self._touched
            return copies.catalog
        answer = await self.call("describe")
        if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], Catalog)):
            raise MalformedReplyError(f"{self.base_url}: describe answered {type(answer).__name__}, not a catalog")
        catalog: Catalog = answer[0]
        self._reset = answer[1] is True and not self._touched
        if copies is not None:
            copies.catalog = catalog
        return catalog

    async def hidden_tools(self, catalog: Catalog) -> set[str]:
        hidden: set[str] = await self.call("hidden_tools", _ANY_CATALOG)  # its sessions are direct: no card read
        return hidden

    async def clear(self) -> None:
        if self._reset:  # reset as it started, untouched since
            self._reset, self._touched = False, True
            return
        await self.call("clear")

    async def state(self) -> Any:
        return await self.call("state")

    async def begin(self, seed: Seed) -> None:
        await self.call("begin", seed)  # the seed, never the task: its grading and solution stay in the server

    async def observe(self, catalog: Catalog, asked: Asked, final_text: str) -> Observation:
        observed: Observation = await self.call("observe", _read_by(asked, catalog), asked, final_text)
        return observed

    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> ToolSession:
        return ChannelToolSession(self, next(self._sessions), role=role, timeout=timeout)

    async def aclose(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
        self._fail_pending(EnvDroppedError(f"{self.base_url}: the channel was closed"))

    async def call(
        self, operation: str, *arguments: Any, timeout: float | None = None, limit: float | None = None
    ) -> Any:
        """One call in the instance; its answer, or the error it raised there. ``timeout``: how long to wait (the
        data plane's by default); ``limit``: the time limit to name when it passes (a tool call's own, which the
        instance enforces first and the server a little later, for a tool that blocks the instance's loop)."""
        if self.ended_by is not None:
            raise InstanceLimitError(str(self.ended_by), kind=self.ended_by.kind)
        if operation not in _READING:
            self._reset, self._touched = False, True
        protocol = await self._connected()
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, operation)
        wait = timeout or self.data_timeout
        try:
            protocol.send((request_id, operation, arguments))
            return await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise EnvTimeoutError(f"{self.base_url}: {operation} did not answer within {limit or wait:g}s") from None
        finally:
            self._pending.pop(request_id, None)

    async def ended(self) -> InstanceLimitError | None:
        """Once the instance has exited: the limit it said it reached, if it said one (what it wrote before it
        ended is read first, within ``_ENDED_WAIT_S``)."""
        if self._protocol is not None and self._closed is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), _ENDED_WAIT_S)
        return self.ended_by

    async def _connected(self) -> _Framed:
        if self._protocol is not None:
            return self._protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is None:
                loop = asyncio.get_running_loop()
                try:
                    _, protocol = await loop.create_unix_connection(self._framed, self.path)
                except OSError as error:
                    raise EnvUnavailableError(f"{self.base_url}: {error!r}") from error
                self._protocol = protocol
                self._closed = asyncio.Event()
            return self._protocol

    def _framed(self) -> _Framed:
        protocol = _Framed(
            lambda message: self._answered(protocol, message),
            lambda error: self._lost(protocol, error),
            loads=self._read,
            dumps=_to_instance,
            max_frame=_MAX_ANSWER,
        )
        return protocol

    def _read(self, frame: memoryview) -> Any:
        """An answer to a call in flight, or a notice, read as data (``_from_instance``). Any other is skipped
        unread (an answer that came after its call timed out): parsing it would cost the server for nothing, as
        often as the instance cared to write one."""
        found = _ANSWER_ID.match(frame)
        if found is None:
            raise ValueError("not an answer: [id, ok, value]")
        request_id = int(found[1])
        if request_id == _NOTICE and len(frame) > _MAX_NOTICE:
            raise ValueError(f"a notice of more than {_MAX_NOTICE} bytes")
        if request_id != _NOTICE and request_id not in self._pending:
            return _UNASKED
        return _from_instance(frame)

    def _answered(self, protocol: _Framed, message: Any) -> None:
        if message is _UNASKED:
            return
        try:
            request_id, ok, value = message
        except (TypeError, ValueError):
            protocol._broken(MalformedReplyError(f"{self.base_url}: an answer that is not (id, ok, value)"))
            return
        if request_id == _NOTICE:  # the instance's last word on this connection
            protocol._broken(self._noticed(value))
            return
        pending = self._pending.get(request_id) if isinstance(request_id, int) else None
        if pending is None or pending[0].done():
            return  # timed out meanwhile
        future, operation = pending
        if ok is not True:
            future.set_exception(_error_from(self.base_url, value))
            return
        try:
            future.set_result(_ANSWERS[operation](value))
        except (TypeError, ValueError, KeyError) as error:
            future.set_exception(MalformedReplyError(f"{self.base_url}: {operation} answered {error}"))

    def _noticed(self, value: Any) -> BaseException:
        """What the instance said unasked: that it reached a limit, and ends; anything else is not the protocol."""
        error = _error_from(self.base_url, value)
        if not isinstance(error, InstanceLimitError):
            error = MalformedReplyError(f"{self.base_url}: a notice that is not one: {error}")
        else:
            self.ended_by = error
        self._fail_pending(error)
        return error

    def _lost(self, protocol: _Framed | None, error: BaseException | None) -> None:
        if protocol is not None and protocol is not self._protocol:
            return  # an earlier connection's end, reported late: its calls failed when it broke
        self._protocol = None
        if self._closed is not None:
            self._closed.set()
        if isinstance(error, MalformedReplyError):
            self._fail_pending(MalformedReplyError(f"{self.base_url}: {error}"))
        else:
            self._fail_pending(EnvDroppedError(f"{self.base_url}: the connection dropped mid-call: {error!r}"))

    def _fail_pending(self, error: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(error)


class ChannelToolSession:
    """An episode's tool session in an instance process: the instance's direct session, driven over the channel."""

    def __init__(self, client: ChannelClient, session: int, *, role: str | None, timeout: float) -> None:
        self._client = client
        self._session = session
        self._role = role
        self.timeout = timeout
        self.session_id: str | None = None  # the instance's own id of the session, as the environment sees it
        self._open = False

    async def open(self) -> ChannelToolSession:
        self.session_id = await self._call("open", self._session, self._role, self.timeout)
        self._open = True
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        result: ToolResult = await self._call("call_tool", self._session, name, arguments)
        return result

    async def list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = await self._call("list_tools", self._session)
        return tools

    async def close(self) -> None:
        """End the session in the instance; an instance that is gone already is not an error."""
        if not self._open:
            return
        self._open, self.session_id = False, None
        with contextlib.suppress(GymhostError):
            await self._client.call("close", self._session, timeout=min(self._wait(), 5.0))

    async def _call(self, operation: str, *arguments: Any) -> Any:
        return await self._client.call(operation, *arguments, timeout=self._wait(), limit=self.timeout)

    def _wait(self) -> float:
        return self.timeout + _MARGIN_S


def _error_from(base_url: str, value: Any) -> BaseException:
    """The bridge's error the instance raised, raised again here; anything else is a malformed reply."""
    try:
        name, message, kind = value
    except (TypeError, ValueError):
        return MalformedReplyError(f"{base_url}: an error answer that is not one: a {type(value).__name__}")
    message = str(message)[:_MAX_SAID]
    cls = getattr(_errors, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, GymhostError)):
        return MalformedReplyError(f"{base_url}: the instance raised {message}")
    if kind is not None and not (
        isinstance(kind, str) and kind in KNOWN_KINDS
    ):  # (a metric's label, and the pool's judgment of the instance)
        return MalformedReplyError(f"{base_url}: the instance raised {name} of an unknown kind")
    try:
        return cls(message, kind=kind) if kind is not None else cls(message)  # type: ignore[call-arg]
    except TypeError:
        return MalformedReplyError(f"{base_url}: the instance raised {name}: {message}")


# -- the instance's side -------------------------------------------------------------------------------------------


_SERVED: set[_Framed] = set()  # the instance's connections to the server, for a notice


class _Served:
    """One connection to an instance process: the server's calls run on the instance's client and its sessions.
    ``reset``: the environment was reset as the instance started (told with ``ready`` and ``describe``)."""

    def __init__(self, client: Any, reset: bool) -> None:
        self.client = client
        self.reset = reset
        self.sessions: dict[int, Any] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.protocol = _Framed(self._received, self._lost, loads=_from_server, dumps=_to_server, max_frame=_MAX_FRAME)
        _SERVED.add(self.protocol)

    def _received(self, message: Any) -> None:
        # Started from the read itself: a call that never waits is answered before this returns, which saves the
        # instance a turn of its event loop a call; one that waits goes on as a task.
        task = start_eagerly(self._answer(message))
        if task is not None and not task.done():
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _answer(self, message: Any) -> None:
        try:
            request_id, operation, arguments = message
        except (TypeError, ValueError):
            return
        try:
            value = await self._run(operation, arguments)
            answer: tuple[Any, bool, Any] = (request_id, True, value)
        except GymhostError as error:
            answer = (request_id, False, (type(error).__name__, str(error), getattr(error, "kind", None)))
        except Exception as error:  # the environment's own: over HTTP, a 500
            answer = (request_id, False, (None, f"{type(error).__name__}: {error}", None))
        with contextlib.suppress(EnvDroppedError):
            try:
                self.protocol.send(answer)
            except Exception as error:  # not JSON (bytes in a state, say), or past _MAX_ANSWER
                said = f"an answer it could not send: {type(error).__name__}: {error}"
                self.protocol.send((request_id, False, (None, said, None)))

    async def _run(self, operation: str, arguments: tuple[Any, ...]) -> Any:
        client = self.client
        if operation == "call_tool":
            session, name, tool_arguments = arguments
            return await self._session(session).call_tool(name, tool_arguments)
        if operation == "ready":  # answered at all: serving (a copy's catalog is known, ``Copies``)
            return self.reset
        if operation == "describe":
            return await client.describe(), self.reset
        if operation == "hidden_tools":
            return await client.hidden_tools(*arguments)
        if operation == "clear":
            return await client.clear()
        if operation == "state":
            return await client.state()
        if operation == "begin":
            return await client.begin(*arguments)
        if operation == "observe":
            return await client.observe(*arguments)
        if operation == "open":
            session, role, timeout = arguments
            # An in-process client's sessions are direct ones, whatever the catalog (``InProcessClient``).
            opened = await client.tool_session(_ANY_CATALOG, role=role, timeout=timeout).open()
            self.sessions[session] = opened
            return opened.session_id
        if operation == "list_tools":
            return await self._session(arguments[0]).list_tools()
        if operation == "close":
            opened = self.sessions.pop(arguments[0], None)
            if opened is not None:
                await opened.close()
            return None
        raise MalformedReplyError(f"the instance knows no operation {operation!r}")

    def _session(self, session: int) -> Any:
        opened = self.sessions.get(session)
        if opened is None:
            raise McpSessionError("the MCP session is not open (or was closed)")
        return opened

    def _lost(self, error: BaseException | None) -> None:
        _SERVED.discard(self.protocol)
        sessions, self.sessions = self.sessions, {}
        for opened in sessions.values():
            task = asyncio.get_running_loop().create_task(opened.close())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


def end_for_limit(reached: Reached) -> NoReturn:
    """In an instance that reached a limit: say which on every connection to the server, and end now. Called from
    a signal handler or from the thread that met the limit, so the notice is written to each socket directly, where
    nothing of the event loop's is waiting to be sent (a frame half sent would garble it)."""
    try:
        said = (InstanceLimitError.__name__, reached.message, reached.failure_kind)
        payload = _to_server((_NOTICE, False, said))
        frame = _HEADER.pack(len(payload)) + payload
        for protocol in list(_SERVED):
            transport = protocol.transport
            if transport is not None and not transport.is_closing() and not transport.get_write_buffer_size():
                with contextlib.suppress(OSError):
                    os.write(transport.get_extra_info("socket").fileno(), frame)
        print(f"gymhost: environment instance: {reached.message}", file=sys.stderr, flush=True)
    finally:
        os._exit(_LIMIT_EXIT)


def listen_at(path: str) -> socket.socket:
    """An instance's channel socket, listening before its environment is built: the server's first describe
    connects at once and waits in the queue for the answer, instead of polling for the socket to appear."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(64)
    return sock


async def serve_instance(client: Any, sock: socket.socket, *, reset: bool = False) -> asyncio.Server:
    """Answer the server's calls on ``sock`` (``listen_at``) with ``client``, an in-process instance's
    (``InProcessClient``); ``reset``: its environment was reset as it started."""
    loop = asyncio.get_running_loop()
    # The socket's file is the server's to remove, with its folder: an instance may not (``_landlock``). Python
    # 3.13's asyncio would remove it as the instance stops.
    keep: dict[str, Any] = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
    return await loop.create_unix_server(lambda: _Served(client, reset).protocol, sock=sock, **keep)
