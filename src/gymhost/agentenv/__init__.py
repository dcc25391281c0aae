"""Agent environments (the agentenv protocol) as NeMo Gym resources servers.

``write_folder`` (``gymhost write``) turns a bundle or the URL of a running environment into a Gym resources-server
folder; the folder's ``app.py`` runs ``AgentEnvResourcesServer``. Writing needs neither nemo-gym nor omegaconf, so
the server class is loaded only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._exceptions import CatalogError, CheckError, SourceError, StartupError, TaskError, WriteError
from ._tasks import Task, load_tasks, task_schema
from ._writer import WrittenFolder, awrite_folder, write_folder

if TYPE_CHECKING:
    from ._server import AgentEnvResourcesServer, AgentEnvResourcesServerConfig

__all__ = [
    "AgentEnvResourcesServer",
    "AgentEnvResourcesServerConfig",
    "CatalogError",
    "CheckError",
    "SourceError",
    "StartupError",
    "Task",
    "TaskError",
    "WriteError",
    "WrittenFolder",
    "awrite_folder",
    "load_tasks",
    "task_schema",
    "write_folder",
]

_NEEDS_NEMO_GYM = {"AgentEnvResourcesServer", "AgentEnvResourcesServerConfig"}


def __getattr__(name: str) -> Any:
    if name in _NEEDS_NEMO_GYM:
        from .._nemo_gym import require_nemo_gym

        require_nemo_gym()
        from . import _server

        return getattr(_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
