"""Every default of the core, written once.

Like httpx's ``_config.py`` and uvicorn's ``Config``: the values live here, the command line shows them as its
defaults, and the modules below receive them instead of keeping defaults of their own. The agent-environment
settings have their own home, ``gymhost.agentenv._config``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_JSON_DEPTH",
    "FOLDER_ENV_VAR",
    "NO_TOKEN",
    "PARENT_PID_ENV_VAR",
    "REPLICA_ENV_VAR",
    "SECRET_ENV_VAR",
    "SERVERS",
    "TOKEN_ENV_VAR",
    "NoToken",
    "ServeConfig",
    "ServerName",
]

DEFAULT_HOST: Final = "127.0.0.1"  # loopback: listening beyond it is a choice, made with a token
DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024  # a long multi-turn transcript with images, bounded per request
DEFAULT_MAX_JSON_DEPTH: Final = 128  # tool schemas and transcripts nest tens deep; Python's recursion breaks near 1,000

TOKEN_ENV_VAR: Final = "GYMHOST_TOKEN"
REPLICA_ENV_VAR: Final = "GYMHOST_REPLICA_ID"
SECRET_ENV_VAR: Final = "GYMHOST_SECRET"
FOLDER_ENV_VAR: Final = "GYMHOST_FOLDER"
PARENT_PID_ENV_VAR: Final = "GYMHOST_PARENT_PID"  # a gymhost process another one started dies with it

ServerName = Literal["uvicorn", "hypercorn"]
SERVERS: Final[tuple[ServerName, ...]] = ("uvicorn", "hypercorn")


class NoToken(enum.Enum):
    """The bearer-token check turned off on purpose: ``token=NO_TOKEN``. ``None`` means "read GYMHOST_TOKEN"."""

    NO_TOKEN = "no token"


NO_TOKEN: Final = NoToken.NO_TOKEN


@dataclass(frozen=True)
class ServeConfig:
    """How ``gymhost serve`` runs an app; kept apart from running it, as uvicorn keeps ``Config`` from ``Server``."""

    host: str = DEFAULT_HOST
    port: int = 8000
    server: ServerName = "uvicorn"
    log_level: str = "info"
    # Off by default, as under Gym's launcher: a line per tool call costs more than the call at high load.
    access_log: bool = False
    # Longer than a trainer's client keep-alive, as Gym's launcher sets it, so the server never closes a connection
    # the client is about to reuse.
    timeout_keep_alive: int = 30
    # On SIGTERM or SIGINT, requests in flight get this long to finish; then they are cancelled and the app's
    # lifespan shuts down (a written agent environment ends its open episodes and stops its instances).
    graceful_timeout: int = 30
    # On SIGTERM or SIGINT the process first drains: no new episodes, open ones go on until they end or this passes.
    # Long enough for an episode with a model thinking between tool calls to finish; a Kubernetes pod needs
    # terminationGracePeriodSeconds above drain_timeout + graceful_timeout (deploy/ uses 160).
    drain_timeout: int = 120
    log_format: Literal["text", "json"] = "text"
    # The path prefix a proxy in front serves the app under (a gateway's process mount): uvicorn's root_path.
    root_path: str = ""
    # Connections the listening socket queues before they are accepted: a burst of the 16k concurrent requests Gym
    # states, each on a connection of its own as verifiers opens them, is a burst of connects. The kernel caps it at
    # net.core.somaxconn (4096 on most Linux hosts; raise it with sysctl).
    backlog: int = 16384
