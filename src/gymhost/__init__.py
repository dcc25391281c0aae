"""gymhost: run NeMo Gym resources servers as standalone ASGI apps.

The public API is assembled here; every other module is an implementation detail (httpx's layout).
"""

from __future__ import annotations

from ._app import HostedServer, create_app
from ._episode import EpisodeClient, ToolOutput, Transcript
from ._exceptions import (
    FolderError,
    GymhostError,
    NemoGymNotInstalledError,
    ServeError,
    ServerClassError,
    UnmappedServerError,
    UpstreamUnavailableError,
)
from ._gateway import GatewayError, create_gateway, mounted_lifespan

__version__ = "0.1.0"

__all__ = [
    "EpisodeClient",
    "FolderError",
    "GatewayError",
    "GymhostError",
    "HostedServer",
    "NemoGymNotInstalledError",
    "ServeError",
    "ServerClassError",
    "ToolOutput",
    "Transcript",
    "UnmappedServerError",
    "UpstreamUnavailableError",
    "__version__",
    "create_app",
    "create_gateway",
    "mounted_lifespan",
]
