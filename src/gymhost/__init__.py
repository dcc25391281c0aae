"""gymhost: run NeMo Gym resources servers as standalone ASGI apps.

The public API is assembled here; every other module is an implementation detail (httpx's layout).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._config import NO_TOKEN, AppSettings, ServeConfig
from ._deferred_imports import defer_httpx_cli
from ._exceptions import (
    ConfinementError,
    FolderError,
    GatewayError,
    GymhostError,
    NemoGymNotInstalledError,
    ServeError,
    ServerClassError,
    UnmappedServerError,
    UpstreamUnavailableError,
)
from ._version import __version__

defer_httpx_cli()  # before anything imports httpx

if TYPE_CHECKING:
    from ._client import EpisodeClient, ToolOutput, Transcript
    from ._hosting._app import HostedServer, create_app
    from ._hosting._gateway import create_gateway, mounted_lifespan
    from ._hosting._loading import load_app
    from ._serving._server import Server

# Where the rest of the public API lives, imported when first asked for: a process that needs one part of gymhost
# (an instance template, which imports environments' code; ``gymhost --help``) does not import all of it (the
# metrics, the middleware, the servers, httpx).
_LAZY = {
    "EpisodeClient": "._client",
    "ToolOutput": "._client",
    "Transcript": "._client",
    "HostedServer": "._hosting._app",
    "create_app": "._hosting._app",
    "create_gateway": "._hosting._gateway",
    "mounted_lifespan": "._hosting._gateway",
    "load_app": "._hosting._loading",
    "Server": "._serving._server",
}


if not TYPE_CHECKING:  # a type checker sees the imports above, and so still finds a misspelled name

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


__all__ = [
    "NO_TOKEN",
    "AppSettings",
    "ConfinementError",
    "EpisodeClient",
    "FolderError",
    "GatewayError",
    "GymhostError",
    "HostedServer",
    "NemoGymNotInstalledError",
    "ServeConfig",
    "ServeError",
    "Server",
    "ServerClassError",
    "ToolOutput",
    "Transcript",
    "UnmappedServerError",
    "UpstreamUnavailableError",
    "__version__",
    "create_app",
    "create_gateway",
    "load_app",
    "mounted_lifespan",
]
