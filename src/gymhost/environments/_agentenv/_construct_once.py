"""Constructing a bundle's environment once, in the template, for every instance to be forked from, when that is safe.

Constructing the environment (its constructor, then FastMCP's: settings read from the process environment, a pydantic
model for each tool) is most of an instance's start-up CPU, and a pool that grows under a cold training batch pays it
once an instance. Done once in the template, it is paid once: each instance is a copy of that one environment, with
memory of its own from the fork on, so nothing one instance changes in memory reaches another.

Anything a constructor makes outside its process's memory would be shared instead: a thread does not survive a fork,
an open descriptor would be one file or socket for every instance, and a directory, a file or a database the
constructor creates would be the same path in every instance, whose episodes would then write over each other's. So
the constructor runs first in a throwaway child of the template, watched: it must start no thread (counted by the
kernel, so threads started by native code count too), leave no descriptor open, and do nothing outside the process
that Python's audit events report (writing a file, making or removing a directory or file, creating a temporary file,
connecting or binding a socket, starting a process, opening a database that is not in memory). Reading files is fine.
When it does any of these, or raises, each instance constructs its own environment after its fork, as before, and
the template says why on stderr.

What stays the same in every instance is what the constructor computed: a value it drew at random (Python's
``random`` module is itself reseeded in each child), the time or the process id it read. An environment that needs
its own per instance draws it in its reset, or its folder sets ``source.construct_once: false``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from typing import Any

from ..._sessions._identity import die_with_parent
from ._launchers import NO_NETWORK_TIMEOUT_S, Constructed, InProcessClient, construct
from ._schema_cache import prepare

__all__ = ["constructed_once"]

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# Audit events of what reaches outside the process (https://docs.python.org/3/library/audit_events.html).
_OUTSIDE = frozenset(
    {
        "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.symlink", "os.link", "os.truncate", "os.chmod",
        "os.chown", "os.utime", "tempfile.mkstemp", "tempfile.mkdtemp", "socket.bind", "socket.connect",
        "socket.sendto", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
        "os.forkpty", "os.kill",
    }
)  # fmt: skip


def constructed_once(environment_class: type[Any]) -> type[Any] | Constructed:
    """The environment constructed here, its first requests' work done (``_prepare``), if a throwaway child's
    construction showed it safe to fork from; otherwise the class, for each instance to construct its own."""
    problem = _probe(environment_class)
    if problem is None:
        threads = _os_threads()
        try:
            constructed = construct(environment_class)
            asyncio.run(_prepare(constructed), loop_factory=asyncio.SelectorEventLoop)  # not the bundle's uvloop
        except Exception as error:
            problem = f"raised {error!r} in the template"
        else:
            if _os_threads() == threads:
                return constructed
            problem = "started a thread in the template"
    name = environment_class.__name__
    print(f"gymhost: {name}: each instance constructs its own environment: its constructor {problem}", file=sys.stderr)
    sys.stderr.flush()
    return environment_class


def _os_threads() -> int:
    """This process's threads as the kernel counts them: those native code started too."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _probe(environment_class: type[Any]) -> str | None:
    """Construct in a throwaway child, watched: None if that was safe to fork from, else what it did."""
    reading, writing = os.pipe()
    template = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(reading)
        problem = "did not finish"
        try:
            if not die_with_parent(signal.SIGKILL, template):
                os._exit(1)
            problem = _construction_problem(environment_class) or ""
        finally:
            os.write(writing, problem.encode(errors="replace")[:4000])
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as answer:
        problem = answer.read().decode(errors="replace")
    os.waitpid(child, 0)
    return problem or None


def _construction_problem(environment_class: type[Any]) -> str | None:
    """In the throwaway child: what constructing the environment did that a fork could not copy, or None."""
    outside: list[str] = []

    def watch(event: str, arguments: tuple[Any, ...]) -> None:
        # Cheap for every other event, and never raising into the constructor.
        if outside:
            return  # the first is enough
        if event == "open":
            path, flags = arguments[0], arguments[2]
            if isinstance(flags, int) and flags & _WRITES and not _bytecode(path):
                outside.append(f"opens {path!r} to write")
        elif event == "sqlite3.connect":
            if arguments[0] not in (":memory:", ""):
                outside.append(f"opens the database {arguments[0]!r}")
        elif event in _OUTSIDE and not (arguments and _bytecode(arguments[0])):
            outside.append(f"calls {event}{arguments!r}")

    tempfile.gettempdir()  # found once per process by writing a file there: tempfile's doing, not the constructor's
    threads, descriptors = _os_threads(), _descriptors()
    sys.addaudithook(watch)  # for this child's life, which ends with the check
    try:
        construct(environment_class)
    except Exception as error:
        return f"raised {error!r}"
    if outside:
        return f"reaches outside its process: it {outside[0]}"
    if _os_threads() != threads:
        return "starts a thread"
    if _descriptors() != descriptors:
        return "leaves a file or socket open"
    return None


def _bytecode(path: Any) -> bool:
    """Whether ``path`` is in a ``__pycache__`` folder: bytecode an import caches is no state of the environment's."""
    if isinstance(path, bytes):
        return b"__pycache__" in path
    return isinstance(path, str) and "__pycache__" in path


def _descriptors() -> frozenset[str]:
    return frozenset(os.listdir("/proc/self/fd"))


async def _prepare(constructed: Constructed) -> None:
    """What each instance would build on its first requests, built once here: the validators of the tools' argument
    and result schemas (``_schema_cache``, found by their JSON text), and what the first read of the card builds on
    its way through the app (ABC checks, the app's middleware stack). Best effort: what fails here is
    built in the instance."""
    with contextlib.suppress(Exception):
        tools = await constructed.mcp_app.list_tools()
        prepare(schema for tool in tools for schema in (tool.inputSchema, tool.outputSchema) if schema is not None)
    client = InProcessClient("http://template.in-process", built=constructed, data_timeout=NO_NETWORK_TIMEOUT_S)
    try:
        with contextlib.suppress(Exception):
            await client.card()
    finally:
        await client.aclose()
