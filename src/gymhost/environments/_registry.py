"""``source.kind`` to its backend: the one list of the environment protocols gymhost speaks.

A new protocol is a backend of its own (a subpackage beside ``_agentenv/`` and ``_openenv/`` whose ``Backend``
subclasses say how to read, write and launch its sources, ``_backend``) and a line here.
"""

from __future__ import annotations

from typing import Any

from ._agentenv._backends import BUNDLE, URLS
from ._backend import Backend, Source, WriteOptions
from ._errors import SourceError
from ._openenv._backends import AGENT_ENV, OPENENV

__all__ = ["BACKENDS", "backend_of", "inspect_source", "kinds"]

# The order `gymhost write` asks them in: folders first (agent-env's format, then gymhost's own bundle, which says
# what a folder lacks), then URLs (an OpenEnv server's Task API, then agentenv instances, which say what a URL lacks).
# bundle and urls answer every folder and URL left to them: a new kind goes before them.
BACKENDS: tuple[Backend[Any], ...] = (AGENT_ENV, BUNDLE, OPENENV, URLS)


def kinds() -> tuple[str, ...]:
    return tuple(backend.kind for backend in BACKENDS)


def backend_of(kind: str) -> Backend[Any]:
    for backend in BACKENDS:
        if backend.kind == kind:
            return backend
    raise ValueError(f"source.kind {kind!r}: expected one of {', '.join(kinds())}")


async def inspect_source(given: str, options: WriteOptions) -> Source:
    """What ``gymhost write`` writes from: ``given`` read by the first backend it is a source of (each refuses the
    options its kind has no use for), its tasks checked and its catalog read from a live instance."""
    for backend in BACKENDS:
        found = await backend.inspect(given, options)
        if found is not None:
            return found
    raise SourceError(f"{given}: not a source gymhost can write from")  # the last folder and URL kinds always answer
