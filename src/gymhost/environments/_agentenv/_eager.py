"""Tasks started at once: a call's work runs up to its first wait before the task that carries it is returned.

Tool calls without HTTP start this way (a direct call's handler in ``_direct``, each call an instance process reads
from its channel in ``_channel``): most tools never wait, so their call has answered before its task would have been
scheduled, which saves a turn of the event loop and a timer a call (``benchmarks/README.md``, "What made it fast"),
and the call still runs in a task of its own, with a context of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["start_eagerly"]


def start_eagerly[T](coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T] | None:
    """``coroutine`` as a task that has run up to its first wait. Made with ``asyncio.Task`` itself
    (``loop.create_task`` takes ``eager_start`` only from Python 3.14), so a loop's task factory does not see it.

    None when the coroutine stopped its process (``SystemExit``, ``KeyboardInterrupt``): that is raised again from
    the event loop, as a scheduled task's step raises it, and the loop ends, rather than into the caller."""
    loop = asyncio.get_running_loop()
    try:
        return asyncio.Task(coroutine, loop=loop, eager_start=True)
    except (SystemExit, KeyboardInterrupt) as stop:
        loop.call_soon(_raise, stop)
        return None


def _raise(error: BaseException) -> None:
    raise error
