"""Instance processes of a bundle: a template process that imports once and forks an instance per request.

``python -m gymhost.environments._agentenv._template BUNDLE`` is the template. Starting an instance process from
scratch costs hundreds of milliseconds of CPU, nearly all of it imports (mcp, pydantic, the environment's module), and
tens of MB of memory of its own (``benchmarks/README.md`` has the numbers); a pool that grows by tens of instances
under a training batch spends its cores on that. The template imports all of it once, then forks: an instance is up in
milliseconds, and shares the imported pages with its siblings until it writes to them.

The protocol on the template's stdin and stdout, one line each way:

- the template says ``gymhost-template fork`` once it has imported everything and, unless told
  ``--construct-each``, constructed the environment where that is safe (``nofork``, and exits, when the
  environment's import started threads, which a fork would not carry over: then the launcher starts each instance
  as a process of its own, ``--serve PATH``, and no template again);
- ``spawn PATH`` asks for an instance answering on the Unix socket PATH; the template binds PATH, forks, hands the
  instance's pidfd over on the socket ``--pidfds FD`` names, and answers ``spawned PID`` at once; the instance
  answers there when it is ready: the pool's first describe connects at once and waits in the socket's queue, with
  no polling for the socket to appear (``failed ERROR``: PATH could not be bound).

Started confined (``--confine RULES``, ``gymhost._confinement``), the template becomes an unprivileged user before it
imports the bundle, and forks each instance into namespaces of its own, where it confines itself before it runs any
of the bundle's code: its own scratch, nothing of its siblings in reach.

An instance runs its environment as the server runs an in-process one (``_launchers.host_in_process``) and answers
the server's calls over its private channel (``_channel``): no ASGI server and no HTTP in the instance.

Where it is safe, the template constructs the environment once and every instance is a copy of it
(``_construct_once``); otherwise each instance constructs its own after its fork.

No instance outlives the server. The template exits when its stdin reaches end of file (the server closed it), and
the kernel kills it when the server dies, whatever it is doing then, importing or constructing the environment
included (``PR_SET_PDEATHSIG``, set as it starts; so the thread that starts the template must last as long as its
pool: the event loop's); each instance asks the kernel to kill it when the template exits. Everything an
environment prints goes to stderr, which the server reads and logs as hosted code's (``gymhost._hosted_output``),
and what it starts reads nothing from stdin: the protocol's two ends are the template's alone
(``_private_protocol``); nor does it hold any other descriptor of the server's (``gymhost._descriptors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from ..._confinement import (
    Limits,
    Rules,
    drop_privileges,
    enter_instance,
    enter_template,
    fork_instance,
    scratch_of,
    watch,
)
from ..._descriptors import close_inherited
from ..._sessions._identity import die_with_parent
from .._errors import StartupError
from ._channel import end_for_limit, listen_at, serve_instance
from ._construct_once import constructed_once
from ._forking import CONFINE, CONSTRUCT_EACH, PIDFDS, SERVE, SERVER_PID, SPAWNED, TEMPLATE_READY
from ._huge_pages import collapse_into_huge_pages
from ._immortal import immortalize
from ._launchers import NO_NETWORK_TIMEOUT_S, Constructed, host_in_process, load_environment_class, stop_in_process
from ._rehearsal import rehearse
from ._schema_cache import install as install_schema_cache

# The reset an instance runs as it starts, at most this long: past it, the lease's clear (with the data plane's
# limit) does it, and says what went wrong.
_START_RESET_S = 30.0
_QUIET_S = 0.1  # no command for this long: the template is idle (the pool's spawns come a millisecond apart)
_USAGE = (
    "usage: python -m gymhost.environments._agentenv._template BUNDLE "
    f"({PIDFDS} FD [{CONSTRUCT_EACH}] | {SERVE} SOCKET_PATH) [{CONFINE} RULES]"
)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(_USAGE)
    bundle, options = Path(argv[0]).resolve(), _options(argv[1:])
    close_inherited(keep={int(options[PIDFDS])} if PIDFDS in options else set())  # the server's, passed by mistake
    rules = Rules.from_argument(options[CONFINE]) if CONFINE in options else None
    if SERVE in options:
        commands, replies = _private_protocol()
        replies.close()  # an instance on its own answers on its socket: its stdout is the server's, not to be kept
        if rules is not None:
            drop_privileges(rules)
        listening = listen_at(options[SERVE])  # before the import: the server's describe waits for it, not the file
        if rules is not None:
            enter_instance(rules, scratch_of(options[SERVE]))  # before the thread below: the instance's
        threading.Thread(target=_exit_at_end_of, args=(commands,), name="parent-watch", daemon=True).start()
        _serve(_load(bundle), listening, rules.limits if rules is not None else None)
    elif PIDFDS in options:
        _die_with_server()
        if rules is not None:
            enter_template(rules)
        pidfds = socket.socket(fileno=int(options[PIDFDS]))
        pidfds.set_inheritable(False)  # the server's, as the commands are: not for what the environment starts
        _template(bundle, construct_once=CONSTRUCT_EACH not in options, rules=rules, pidfds=pidfds)
    else:
        raise SystemExit(_USAGE)


def _options(arguments: list[str]) -> dict[str, str]:
    """``--name VALUE`` pairs and ``--construct-each``, the only flag; anything else ends the process with usage."""
    options, rest = {}, list(arguments)
    while rest:
        name = rest.pop(0)
        if name == CONSTRUCT_EACH:
            options[name] = ""
        elif name in (CONFINE, PIDFDS, SERVE) and rest:
            options[name] = rest.pop(0)
        else:
            raise SystemExit(_USAGE)
    return options


def _template(bundle: Path, *, construct_once: bool, rules: Rules | None, pidfds: socket.socket) -> None:
    commands, replies = _private_protocol()
    environment_class = _load(bundle)
    _preload()
    if threading.active_count() != 1 or not hasattr(os, "fork"):
        _say(replies, f"{TEMPLATE_READY} nofork")
        os._exit(0)  # the launcher starts each instance with --serve instead; the import's threads go with this
    environment = constructed_once(environment_class) if construct_once else environment_class
    _say(replies, f"{TEMPLATE_READY} fork")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the instances; the server watches them by pidfd
    gc.collect()
    gc.freeze()  # what is imported now is never written by the collector again: the pages stay shared
    template = os.getpid()
    for line in _commands(commands, idle=_settle):
        command, _, path = line.strip().partition(" ")
        if command != "spawn" or not path:
            continue
        try:
            listening = listen_at(path)  # in the template: listening before the fork returns to the server
        except OSError as error:
            _say(replies, f"failed {error!r}")
            continue
        try:
            pid, pidfd = (os.fork(), -1) if rules is None else fork_instance(rules, scratch_of(path))  # confined
        except OSError as error:
            listening.close()
            _say(replies, f"failed {error}")
            continue
        if pid == 0:
            replies.close()  # the protocol is the template's
            os.close(commands)
            pidfds.close()
            _forked(environment, listening, template if rules is None else None, rules)
        listening.close()  # the instance's now
        try:
            _hand_over(pidfds, pid, pidfd)
            _say(replies, f"{SPAWNED} {pid}")
        except (BrokenPipeError, ConnectionResetError):  # the server died meanwhile: so does this template, now
            os._exit(0)
    os._exit(0)  # the server is gone or done with us: the instances follow (PR_SET_PDEATHSIG)


def _commands(fd: int, idle: Callable[[], None] | None) -> Iterator[str]:
    """The server's command lines, read from ``fd`` unbuffered so that ``idle`` runs, once, the first time no command
    has come for ``_QUIET_S``: after the pool's first spawns (the server sends them one after another, each as the
    last is answered), and before a batch's, unless the batch comes first."""
    pending = b""
    while True:
        while b"\n" not in pending:
            if idle is not None and not select.select([fd], [], [], _QUIET_S)[0]:
                idle()
                idle = None
            try:
                chunk = os.read(fd, 65536)
            except ConnectionResetError:  # a socket (a template started early) closed with our line unread: the end
                chunk = b""
            if not chunk:
                if pending:
                    yield pending.decode(errors="replace")
                return
            pending += chunk
        line, _, pending = pending.partition(b"\n")
        yield line.decode(errors="replace")


def _settle() -> None:
    """Once the template is idle: the instances' serving path rehearsed (``_rehearsal``), then everything the
    template holds made immortal (``_immortal``), so that each instance forked after it starts warm and copies a
    third fewer of the template's pages, and its memory made huge pages (``_huge_pages``), so that a fork and an
    exit handle fewer page-table entries. Not before the pool's first instances, which the server waits for to say
    it is ready: it takes a tenth of a second or two of the template's CPU, and spawns wait meanwhile. Best effort:
    a template that cannot goes on as it was."""
    gc.unfreeze()  # back in the collector's sight (gc.get_objects skips frozen objects), to be found
    try:
        rehearse()
    except (Exception, asyncio.CancelledError) as error:  # the instances start cold, as before
        print(f"gymhost: instance template: its rehearsal failed: {error!r}", file=sys.stderr)
    try:
        gc.collect()  # what the rehearsal left is garbage, not to be kept forever
        immortalize()
    except Exception as error:  # MemoryError, on a heap too large to walk: forks copy more, nothing else changes
        print(f"gymhost: instance template: its objects were not made immortal: {error!r}", file=sys.stderr)
    finally:
        gc.freeze()
    try:
        collapse_into_huge_pages()  # last: what is written above stays where it is, in pages of any size
    except Exception as error:  # forks copy more page tables, nothing else changes
        print(f"gymhost: instance template: its memory was not made huge pages: {error!r}", file=sys.stderr)


def _hand_over(pidfds: socket.socket, pid: int, pidfd: int) -> None:
    """The instance's pidfd (``fork_instance``'s, or opened here), to the server: the one handle on it that means
    the same in every PID namespace."""
    if pidfd < 0:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already (and reaped: SIGCHLD is ignored): the server hears "-"
            pidfds.sendall(b"-")
            return
    try:
        socket.send_fds(pidfds, [b"p"], [pidfd])
    finally:
        os.close(pidfd)


def _die_with_server() -> None:
    """Killed by the kernel when the server that started this template dies, whatever the template is doing then:
    the end of its commands tells it only once it reads them, after the environment's import and construction,
    either of which may never finish. Then its instances go too (each dies with the template)."""
    server = int(os.environ.pop(SERVER_PID, os.getppid()))
    if not die_with_parent(signal.SIGKILL, server):
        print(f"gymhost: instance template: the server {server} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(1)


def _forked(
    environment: type[Any] | Constructed, listening: socket.socket, template: int | None, rules: Rules | None
) -> None:
    """In the forked child: die with the template (``template`` None: confined, ``fork_instance`` saw to it), leave
    the template's pipes alone, serve until stopped."""
    try:
        if template is not None and not die_with_parent(signal.SIGKILL, template):
            os._exit(1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _serve(environment, listening, rules.limits if rules is not None else None)
    except BaseException as error:  # nothing may return into the template's loop
        print(f"gymhost: environment instance {os.getpid()} stopped: {error!r}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


def _serve(environment: type[Any] | Constructed, listening: socket.socket, limits: Limits | None) -> None:
    """Run one instance and answer the server on its channel (``_channel``) until SIGTERM; one that reaches one of
    its ``limits`` (confined: ``fork_instance`` set them) says which there, and ends.

    The instance is a batch process to the scheduler (``SCHED_BATCH``: same share of the CPU, no preemption on
    wakeup). Each call the server writes to an instance wakes it; as an ordinary process it would take the core from
    the server in the middle of its event loop's turn, one request at a time, where the server would rather write
    to every instance it has calls for and then yield."""
    with contextlib.suppress(OSError, AttributeError):  # Linux; elsewhere an ordinary process
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    try:
        import uvloop

        uvloop.run(_instance(environment, listening, limits))
    except ImportError:
        asyncio.run(_instance(environment, listening, limits))


async def _instance(environment: type[Any] | Constructed, listening: socket.socket, limits: Limits | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # The server times its calls itself (``ChannelClient``); the in-memory transport never waits on a network.
    instance = await host_in_process(environment, 0, NO_NETWORK_TIMEOUT_S)
    if limits is not None:
        watch(limits, end_for_limit)
    # Reset as before every episode, here rather than at its lease: the round trip saved. An environment without
    # a reset, or whose reset fails, is left to the lease, which says so to the seed as before.
    try:
        await asyncio.wait_for(instance.client.clear(), _START_RESET_S)
        reset = True
    except Exception as error:  # the lease clears it, and tells the seed what goes wrong then
        print(f"gymhost: environment instance {os.getpid()}: its reset as it started: {error!r}", file=sys.stderr)
        reset = False
    server = await serve_instance(instance.client, listening, reset=reset)  # the describe queued meanwhile answered
    await stop.wait()
    server.close()
    await stop_in_process(instance)


def _load(bundle: Path) -> type[Any]:
    # FastMCP configures INFO logging of every MCP request unless logging is configured first.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        environment_class = load_environment_class(bundle)
    except StartupError as error:
        raise SystemExit(str(error)) from None
    install_schema_cache()  # instance processes check tool results against their schemas as in-process ones do
    return environment_class


def _preload() -> None:
    """What an instance imports on its way to serving, imported before the fork instead of in every instance."""
    import anyio._backends._asyncio  # noqa: F401  (anyio imports it when an instance starts its first task group)
    import mcp.server.fastmcp
    import mcp.server.streamable_http_manager  # noqa: F401

    from . import _direct  # noqa: F401  (an instance's tool session; the server's launchers import it only in use)

    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401


def _private_protocol() -> tuple[int, TextIO]:
    """The protocol's two ends, as file descriptors of this process alone (not inherited by what it starts): the
    commands read and the replies written. File descriptor 0 becomes ``/dev/null`` and 1 stderr, for the
    environment's code: what it prints goes to stderr, and a process it starts (at its import, say) that reads its
    stdin finds it empty, where it would have read, and taken, the server's commands; nor does such a process hold
    the server's end of the channel open once this one is gone."""
    commands = os.dup(0)
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return commands, replies


def _say(replies: TextIO, line: str) -> None:
    try:
        replies.write(line + "\n")
        replies.flush()
    except BrokenPipeError:  # the server died (its kill is on its way here too): go now, without a traceback
        os._exit(0)


def _exit_at_end_of(commands: int) -> None:
    """Block until the server closes our commands or dies, then exit: nobody writes to them but the server."""
    try:
        while os.read(commands, 65536):
            pass
    except ConnectionResetError:  # a socket closed with a line unread: the end too
        pass
    finally:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
