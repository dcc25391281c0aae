"""A written folder's hosted code started before its server is built: ``gymhost serve``'s head start.

Serving a process-mode folder, the server imports nemo-gym and builds its app (about a second), then its pool's
instance template imports the bundle and constructs its environment (half a second more) before the first instance
forks and the server is ready. The two are independent and each takes one core: ``gymhost serve`` of one written
folder starts the template first, from the folder's config as the launcher will read it, and the launcher adopts it
if it would have started that very template (``_agentenv._forking``), else stops it and starts its own. The start
is made on the server's main thread, which lives as long as the server: a process's parent-death signal
(bubblewrap's ``--die-with-parent``, the template's own) follows the thread that started it, not its process. (A
thread of its own, to choose the confinement while the imports go on, gained 0.02 s here and nothing measurable in
the image, where the choice's probes take the second core the template needs.) Best effort: whatever goes wrong here
is left to the build, which says it in its own words.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._hosting._folder import load_server_spec

__all__ = ["start_early", "stop_early"]

logger = logging.getLogger("gymhost.environments")

_began = False  # whether a start was made (``stop_early`` has something to look at)


def start_early(folder: Path, *, config_key: str | None, overrides: Mapping[str, Any]) -> None:
    """Start what ``folder``'s launcher will start first, if it is a written folder whose launcher starts something
    (a process-mode bundle's template); ``config_key`` and ``overrides`` as the app is built with."""
    global _began
    try:
        spec = load_server_spec(folder, config_key=config_key, overrides=overrides)
        if not spec.written:
            return  # a Gym server's folder: nothing of gymhost's to start (and its imports are not made here)
        block = spec.block["source"]
        from ._backend import ServerFolder, resolve_in
        from ._registry import backend_of
        from ._settings import DEFAULT_TASKS

        backend = backend_of(str(block["kind"]))
        owner = spec.implementation
        where = ServerFolder(
            lambda value, what: resolve_in(spec.folder, value, what, owner),
            {},
            str(spec.block.get("environment", "")),
            owner,
            resolve_in(spec.folder, str(spec.block.get("tasks", DEFAULT_TASKS)), "tasks", owner),
        )
        source = backend.source_config.model_validate(block)
        _began = True
        backend.start_early(source, where, cwd=spec.folder)
    except Exception as error:  # the build meets it again, and says it
        logger.debug("%s: its hosted code not started early: %r", folder, error)


def stop_early() -> None:
    """Stop what ``start_early`` started that the server's launcher did not adopt."""
    if not _began:
        return
    from ._agentenv._forking import stop_early as stop_template

    stop_template()
