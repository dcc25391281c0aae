"""Where a bundle's and a URL's agentenv instances come from (the process launcher is ``_forking``'s):

- ``InProcessLauncher``: instances of the bundle's environment class inside the server, their card and data plane
  reached through an in-memory ASGI transport and their tools called directly (``_direct``). Same protocol, same
  behaviour, no process per episode: the way to hold hundreds of episodes.
- ``UrlLauncher``: instances someone else runs; gymhost only talks to them.

``load_environment_class`` imports a bundle's ``env.py``, for both kinds of bundle instances.

mcp (and jsonschema with it) is imported only where an environment is hosted in this process (``construct``, a direct
tool session): a server whose instances are processes, or elsewhere, never hosts one, and importing mcp took 7% of
such a server's CPU to ready (benchmarks/README.md, "Start-up imports").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..._hosting._entrypoint import own_siblings
from ..._logging import fastmcp_leaves_logging_alone
from .._backend import ELSEWHERE, Catalog, Instance, ToolSession, forever
from .._errors import DataPlaneError, StartupError
from .._settings import PoolSettings
from . import _in_memory
from ._client import EnvClient

__all__ = [
    "ENTRY",
    "NO_NETWORK_TIMEOUT_S",
    "Constructed",
    "InProcessClient",
    "InProcessLauncher",
    "UrlLauncher",
    "construct",
    "host_in_process",
    "load_environment_class",
    "stop_in_process",
]

logger = logging.getLogger("gymhost.environments")

ENTRY = "env.py"  # a bundle's environment module
# The data-plane limit of an instance's in-memory transport, which never waits on a network (the server times its
# calls to an instance process itself).
NO_NETWORK_TIMEOUT_S = 3600.0
_STOP_GRACE_S = 5.0


@dataclass(eq=False)
class _Hosted:
    """An in-process instance's app, whose lifespan runs in a task of its own (an anyio task group must be left in
    the task that entered it, and instances are started and stopped from different tasks)."""

    task: asyncio.Task[None]
    stop: asyncio.Event


def load_environment_class(bundle: Path) -> type[Any]:
    """The one concrete ``AgentEnvEnvironment`` subclass ``bundle/env.py`` defines, imported with the bundle
    folder importable (for its sibling modules) under a module name of its own."""
    from agentenv_protocol import AgentEnvEnvironment

    entry = bundle / ENTRY
    name = f"gymhost_bundle_env_{hashlib.sha1(str(entry).encode()).hexdigest()[:10]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, entry)
        if spec is None or spec.loader is None:
            raise StartupError(f"{entry}: not an importable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            # Its sibling modules are its own even when another bundle in this process has one of the same name.
            with own_siblings(bundle, name):
                spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[name]
            raise StartupError(f"{entry}: importing it failed: {error!r}") from error
    found = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, AgentEnvEnvironment)
        and value is not AgentEnvEnvironment
        and value.__module__ == module.__name__
        and not inspect.isabstract(value)
    ]
    if len(found) != 1:
        names = ", ".join(sorted(cls.__name__ for cls in found)) or "none"
        raise StartupError(f"{entry}: expected one AgentEnvEnvironment subclass, found {names}")
    return found[0]


class UrlLauncher:
    """Instances someone else runs; gymhost only talks to them."""

    owns_instances = False
    confinement_level = ELSEWHERE

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = [url.rstrip("/") for url in urls]
        self.description = f"{len(self.urls)} environment URL(s)"

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        return Instance(index, EnvClient(self.urls[index], data_timeout=settings.data_timeout_s))

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()

    async def exited(self, instance: Instance) -> None:
        await forever()  # a process elsewhere: its going quiet is how the pool hears of it

    async def close(self) -> None:
        pass


class InProcessClient(EnvClient):
    """An in-process instance's client: the card and the data plane its app called directly (``_in_memory``), tool
    calls straight on its FastMCP server (``_direct``), with no HTTP in between. Its HTTP client, over an in-memory
    transport, is there for MCP over the wire (``McpSession``), which the tests hold the direct calls to."""

    def __init__(self, base_url: str, *, built: Constructed, data_timeout: float) -> None:
        super().__init__(base_url, transport=httpx.ASGITransport(app=built.app), data_timeout=data_timeout)
        self._app = built.app
        self._mcp_app = built.mcp_app

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await _in_memory.request(self._app, self.base_url, method, path, **kwargs)

    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> ToolSession:
        from ._direct import DirectToolSession  # mcp's: imported where an environment is hosted (the docstring above)

        return DirectToolSession(self._mcp_app, role=role, timeout=timeout)


class InProcessLauncher:
    """Instances of the bundle's environment class inside this process: the same card, data plane and tools as a
    process instance, without the process. The card and data plane are reached through an in-memory ASGI transport,
    tool calls directly on the server object (``InProcessClient``)."""

    owns_instances = True
    confinement_level = "none"  # inside the server: never confined (it says so as its first instance starts)

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.description = f"bundle {bundle} (in-process)"

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        environment_class = load_environment_class(self.bundle)
        if index == 0:
            logger.warning(
                "%s: its code runs inside the server, with everything the server holds (the session-signing secret "
                "included), and cannot be confined; write it with --mode process to run it apart",
                self.description,
            )
            _warn_about_blocking_handlers(environment_class)
        instance = await host_in_process(environment_class, index, settings.data_timeout_s)
        with contextlib.suppress(DataPlaneError):  # not reset (an environment without a reset): the lease tries
            await instance.client.clear()  # in this process, the reset costs no more now than at its lease
            instance.cleared = True
        return instance

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await stop_in_process(instance, graceful=graceful)

    async def exited(self, instance: Instance) -> None:
        assert instance.hosted is not None
        await asyncio.wait([instance.hosted.task])  # its app's lifespan ended: stopped, or crashed

    async def close(self) -> None:
        pass


@dataclass(frozen=True, eq=False)
class Constructed:
    """An environment constructed, with its MCP server and that server's ASGI app, not yet running: what an
    instance needs before its event loop starts. A template process builds one and forks instances from it."""

    environment: Any
    mcp_app: Any
    app: Any


def construct(environment_class: type[Any]) -> Constructed:
    """The environment's constructor, then its MCP server's: most of an instance's start-up CPU."""
    from ._schema_cache import install as install_schema_cache  # jsonschema: where an environment is hosted

    environment = environment_class()
    install_schema_cache()
    with fastmcp_leaves_logging_alone():
        mcp_app = environment.create_app()
        app = mcp_app.streamable_http_app()
    return Constructed(environment, mcp_app, app)


async def host_in_process(environment: type[Any] | Constructed, index: int, data_timeout: float) -> Instance:
    """An instance in this process, its app's lifespan running: the server's in-process instances, and the one an
    instance process serves over its channel (``_template``), constructed there or before its fork."""
    built = environment if isinstance(environment, Constructed) else construct(environment)
    started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(_host(built.app, started, stop), name=f"gymhost-env-instance-{index}")
    await started
    client = InProcessClient(f"http://instance-{index}.in-process", built=built, data_timeout=data_timeout)
    return Instance(index, client, hosted=_Hosted(task, stop))


async def stop_in_process(instance: Instance, *, graceful: bool = True) -> None:
    await instance.client.aclose()
    if instance.hosted is not None:
        instance.hosted.stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(instance.hosted.task), _STOP_GRACE_S if graceful else 0.1)
        except TimeoutError:
            instance.hosted.task.cancel()
        except Exception as error:
            logger.warning("in-process environment instance %s stopped with %r", instance.index, error)


def _warn_about_blocking_handlers(environment_class: type[Any]) -> None:
    """In-process, a handler that is not ``async`` runs on the server's event loop: while it runs, every episode
    and every request waits, and no timeout can interrupt it. Process mode has no such limit."""
    blocking = sorted(
        name
        for name, member in inspect.getmembers(environment_class, inspect.isfunction)
        if any(hasattr(member, marker) for marker in ("_aee_tool", "_aee_op", "_aee_ext"))
        and not inspect.iscoroutinefunction(member)
    )
    if blocking:
        logger.warning(
            "%s: %s are not async; in-process instances run them on the server's event loop, where they block "
            "every other episode while they run (process mode does not)",
            environment_class.__name__,
            ", ".join(blocking),
        )


async def _host(app: Any, started: asyncio.Future[None], stop: asyncio.Event) -> None:
    try:
        async with app.router.lifespan_context(app):
            started.set_result(None)
            await stop.wait()
    except BaseException as error:
        if started.done():
            raise
        started.set_exception(StartupError(f"an in-process environment instance did not start: {error!r}"))
