"""An agent-env env type whose MCP server runs inside the agent-env process: an env with tools of its own, no Docker.

agent-env's own env types deploy images. An env that a task never deploys is bound by its ``mcp_url`` instead
(``deploy_agent``'s ``env_ids``; agent_env/task_step/task_steps/deploy_agent.py, ``live_mcp_url``), and this type
gives one: the FastMCP server its env.toml names, served on loopback in a thread of its own the first time an
episode asks for it, and kept for the process's life. Registered in the bundle's ``.agentenv/config.toml``::

    [envs]
    impls = ["in_process_mcp:InProcessMCPEnv"]

and used by an env folder's env.toml::

    type = "in_process_mcp"
    server = "calc_tools:server"   # a FastMCP object, importable from the bundle folder
"""

from __future__ import annotations

import importlib
import socket
import threading
import time
from typing import Any, ClassVar

import uvicorn
from agent_env.env.env import Env

_STARTUP_S = 10.0
_served: dict[str, str] = {}
_lock = threading.Lock()


def _url_of(server: str) -> str:
    """The MCP URL of ``server`` (``module:attribute``), serving it first if this process has not yet."""
    with _lock:
        if server not in _served:
            module, _, attribute = server.partition(":")
            app = getattr(importlib.import_module(module), attribute).streamable_http_app()
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            running = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
            threading.Thread(target=running.run, kwargs={"sockets": [sock]}, name=server, daemon=True).start()
            deadline = time.monotonic() + _STARTUP_S
            while not running.started:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the MCP server {server} did not start in {_STARTUP_S:g}s")
                time.sleep(0.01)
            _served[server] = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        return _served[server]


class InProcessMCPEnv(Env):
    type: ClassVar[str] = "in_process_mcp"
    description = "An MCP server that runs inside the agent-env process, on loopback"

    def __init__(self, id: str, version: int | None, server: str, metadata: dict[str, Any] | None = None) -> None:
        super().__init__(id, version, metadata=metadata)
        if ":" not in server:
            raise ValueError(f"server must be module:attribute, not {server!r}")
        self.server = server

    @property
    def mcp_url(self) -> str:
        return _url_of(self.server)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "server": self.server}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InProcessMCPEnv:
        return cls(id=data["id"], version=data.get("version"), server=data["server"], metadata=data.get("metadata"))

    async def deploy(self, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.id} runs in the agent-env process; bind it with deploy_agent's env_ids")
