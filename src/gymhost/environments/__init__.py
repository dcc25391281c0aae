"""Environments as NeMo Gym resources servers: any protocol gymhost speaks (agentenv, OpenEnv, agent-env bundles).

``write_folder`` (``gymhost write``) turns a bundle folder or the URL of a running environment into a Gym
resources-server folder; the folder's ``app.py`` runs ``WrittenResourcesServer``. This is the public import path
(``gymhost.agentenv``, where folders written before it import from, names the same objects).

``AgentEnvResourcesServer`` and ``AgentEnvResourcesServerConfig`` are the server's names before 0.1.0's rename (the
server serves every protocol, not agentenv's alone): folders written then import them, and get the same classes.

Every name is loaded when first asked for: the command line reads this package's settings without importing the
protocols' clients (mcp, websockets), and writing a folder needs neither nemo-gym nor omegaconf, which the server
class does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._errors import CatalogError, CheckError, SourceError, StartupError, TaskError, WriteError
    from ._server import WrittenResourcesServer, WrittenResourcesServerConfig
    from ._tasks import Task, load_tasks, task_schema
    from ._writing._writer import WrittenFolder, awrite_folder, write_folder

    AgentEnvResourcesServer = WrittenResourcesServer
    AgentEnvResourcesServerConfig = WrittenResourcesServerConfig

__all__ = [
    "CatalogError",
    "CheckError",
    "SourceError",
    "StartupError",
    "Task",
    "TaskError",
    "WriteError",
    "WrittenFolder",
    "WrittenResourcesServer",
    "WrittenResourcesServerConfig",
    "awrite_folder",
    "load_tasks",
    "task_schema",
    "write_folder",
]

_HOMES = {
    **dict.fromkeys(
        ("CatalogError", "CheckError", "SourceError", "StartupError", "TaskError", "WriteError"), "_errors"
    ),
    **dict.fromkeys(("WrittenResourcesServer", "WrittenResourcesServerConfig"), "_server"),
    **dict.fromkeys(("Task", "load_tasks", "task_schema"), "_tasks"),
    **dict.fromkeys(("WrittenFolder", "awrite_folder", "write_folder"), "_writing._writer"),
}


# Names written folders import that were renamed: the old name, the new one.
_RENAMED = {
    "AgentEnvResourcesServer": "WrittenResourcesServer",
    "AgentEnvResourcesServerConfig": "WrittenResourcesServerConfig",
}


def __getattr__(name: str) -> Any:
    name = _RENAMED.get(name, name)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if home == "_server":
        from .._nemo_gym import require_nemo_gym

        require_nemo_gym()
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
