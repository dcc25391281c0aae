"""Lifespans: the one place gymhost runs an app's lifespan and adds work around it.

Several things must start with a server and stop with it (Gym's outbound HTTP client, a written environment's
instances and episodes), and the app Gym builds already has a lifespan (its MCP session manager on 0.5+).
``wrap_lifespan`` puts a context around it: entered before the app's lifespan starts, left after it ends, so what
the wrapper starts is there for the whole of the app's life; ``on_lifespan`` runs a callback once all of it is up.

Running one: an ASGI server drives a lifespan through the ASGI lifespan protocol, and Starlette hands it a formatted
traceback when startup fails; ``LifespanRunner`` stands in front of the app for that protocol only, so a folder whose
environment will not start reports the one-line message its ``GymhostError`` carries, like every other gymhost
error. Starlette runs the lifespan of the top app only, never of a mounted one: ``running_lifespan`` runs one app's
lifespan as an async context, for the gateway's mounts and for hosts that run an app in-process (``gymhost check``,
tests).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.types import Receive, Scope, Send

from .._exceptions import GymhostError

__all__ = ["LifespanRunner", "has_lifespan", "on_lifespan", "running_lifespan", "wrap_lifespan"]


def wrap_lifespan(app: Any, around: Callable[[Any], AbstractAsyncContextManager[None]]) -> None:
    """Run ``around(app)`` outside ``app``'s current lifespan. Wrapped twice, the later wrapper is outermost."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with around(app_), inner(app_) as state:
            yield state

    app.router.lifespan_context = lifespan


def on_lifespan(app: Any, started: Callable[[Any], None], stopping: Callable[[Any], None]) -> None:
    """Call ``started(app)`` once everything the app's lifespan starts is up, and ``stopping(app)`` before any of it
    stops: for what depends on the whole app being there (its readiness)."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            started(app_)
            try:
                yield state
            finally:
                stopping(app_)

    app.router.lifespan_context = lifespan


def has_lifespan(app: Any) -> bool:
    """Whether ``app`` is a Starlette app (FastAPI included) whose lifespan gymhost can run."""
    return hasattr(getattr(app, "router", None), "lifespan_context")


@asynccontextmanager
async def running_lifespan(app: Any) -> AsyncIterator[Any]:
    """``app``'s lifespan, started on entry and stopped on exit; yields the state it started with."""
    async with app.router.lifespan_context(app) as state:
        yield state


class LifespanRunner:
    """An app as an ASGI server sees it, with gymhost's own startup errors reported as one line (``startup_error``).

    Anything else keeps its traceback; apps without a Starlette router pass through untouched.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.startup_error: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan" or not has_lifespan(self.app):
            await self.app(scope, receive, send)
            return
        await receive()  # lifespan.startup
        context = running_lifespan(self.app)
        try:
            state = await context.__aenter__()
        except GymhostError as error:
            self.startup_error = str(error)
            await send({"type": "lifespan.startup.failed", "message": ""})
            return
        except BaseException:
            await send({"type": "lifespan.startup.failed", "message": traceback.format_exc()})
            return
        if state and "state" in scope:
            scope["state"].update(state)
        await send({"type": "lifespan.startup.complete"})
        try:
            await receive()  # lifespan.shutdown
        except asyncio.CancelledError:
            # A second SIGTERM or SIGINT: the server stops at once, without the lifespan's shutdown (what it started
            # dies with the process), and without the traceback uvicorn would log for a cancelled lifespan.
            return
        try:
            await context.__aexit__(None, None, None)
        except BaseException:
            await send({"type": "lifespan.shutdown.failed", "message": traceback.format_exc()})
            return
        await send({"type": "lifespan.shutdown.complete"})
