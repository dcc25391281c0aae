"""Keeping a host's logging its own.

mcp's ``FastMCP`` constructor calls ``logging.basicConfig(level=INFO, handlers=[RichHandler])`` on the root logger.
In a process of its own that is harmless; in a server that builds FastMCP apps (nemo-gym 0.4.0's MCP resources
servers, in-process environment instances) it turns on an INFO line, through a rich console, for every HTTP request
any library makes, for the rest of the process. gymhost builds those apps inside this context, which makes that
one call a no-op and leaves logging as the host configured it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["fastmcp_leaves_logging_alone"]


@contextlib.contextmanager
def fastmcp_leaves_logging_alone() -> Iterator[None]:
    try:
        from mcp.server.fastmcp import server as fastmcp_server
    except ImportError:
        yield
        return
    original = fastmcp_server.configure_logging  # type: ignore[attr-defined]

    def leave_alone(*args: Any, **kwargs: Any) -> None:
        return None

    fastmcp_server.configure_logging = leave_alone  # type: ignore[attr-defined]
    try:
        yield
    finally:
        fastmcp_server.configure_logging = original  # type: ignore[attr-defined]
