"""gymhost: run NeMo Gym resources servers as standalone ASGI apps.

The public API is assembled here; every other module is an implementation detail (httpx's layout).
"""

from __future__ import annotations

# ruff: noqa: E402 (httpx's command-line client is deferred before anything imports httpx)
from ._deferred_imports import defer_httpx_cli

defer_httpx_cli()

from ._client import EpisodeClient, ToolOutput, Transcript
from ._config import NO_TOKEN, AppSettings, ServeConfig
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
from ._hosting._app import HostedServer, create_app
from ._hosting._gateway import create_gateway, mounted_lifespan
from ._hosting._loading import load_app
from ._serving._server import Server
from ._version import __version__

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
