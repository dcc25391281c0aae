"""Wrapping an app's lifespan: the one way gymhost adds work around the lifespan an app already has.

Several things must start with a server and stop with it (Gym's outbound HTTP client, a written environment's
instances and episodes), and the app Gym builds already has a lifespan (its MCP session manager on 0.5+).
``wrap_lifespan`` puts a context around it: entered before the app's lifespan starts, left after it ends, so what
the wrapper starts is there for the whole of the app's life. Running a lifespan is ``_lifespan_runner``'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

__all__ = ["on_lifespan", "wrap_lifespan"]


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
