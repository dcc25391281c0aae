"""Running an app's lifespan: for an ASGI server (``LifespanRunner``), and for apps Starlette will not run.

An ASGI server drives a lifespan through the ASGI lifespan protocol; Starlette hands it a formatted traceback when
startup fails. ``LifespanRunner`` stands in front of the app for that protocol only, so a folder whose environment
will not start reports the one-line message its ``GymhostError`` carries, like every other gymhost error.

Starlette runs the lifespan of the top app only, never of a mounted one. ``running_lifespan`` runs one app's
lifespan as an async context: the gateway uses it for each mount, and hosts (``gymhost check``, tests) use it to
run an app in-process. Wrapping a lifespan with more work is ``_lifespan``'s.
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.types import Receive, Scope, Send

from ._exceptions import GymhostError

__all__ = ["LifespanRunner", "has_lifespan", "running_lifespan"]


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
        await receive()  # lifespan.shutdown
        try:
            await context.__aexit__(None, None, None)
        except BaseException:
            await send({"type": "lifespan.shutdown.failed", "message": traceback.format_exc()})
            return
        await send({"type": "lifespan.shutdown.complete"})
