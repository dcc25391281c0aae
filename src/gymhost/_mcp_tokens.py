"""MCP session tokens signed with the process secret instead of Gym's public string.

nemo-gym signs the token of an MCP session with the server's public ``<Class>___<name>``, so anyone can forge one.
gymhost signs them with a key derived from the process secret and that string (``_secret.server_secret``): a token
of one server is no token at another, and nobody can make one up. nemo-gym 0.4.0 keeps the serializer on the
class-based MCP server (``_mcp_token_serializer``); 0.5+'s auto-exposure reads the key once, when it is installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ._secret import server_secret

__all__ = ["secret_mcp_tokens", "signing_mcp_tokens_with_secret"]


def secret_mcp_tokens(server: Any) -> None:
    """nemo-gym 0.4.0: sign the class-based MCP server's session tokens with the process secret."""
    if not hasattr(server, "_mcp_token_serializer"):
        return
    from itsdangerous import URLSafeSerializer
    from nemo_gym import base_resources_server

    salt = getattr(base_resources_server, "_MCP_TOKEN_SALT", "nemo-gym-mcp-session-token")
    serializer = URLSafeSerializer(server_secret(server.get_session_middleware_key()), salt=salt)
    object.__setattr__(server, "_mcp_token_serializer", lambda: serializer)


@contextlib.contextmanager
def signing_mcp_tokens_with_secret(server: Any) -> Iterator[None]:
    """nemo-gym 0.5+: auto-exposure builds its token serializer from ``get_session_middleware_key()`` when it is
    installed; for that moment the key is this server's secret. Everything else keeps reading the public name."""
    secret = server_secret(server.get_session_middleware_key())
    key: Callable[[], str] = lambda: secret  # noqa: E731
    object.__setattr__(server, "get_session_middleware_key", key)
    try:
        yield
    finally:
        del server.__dict__["get_session_middleware_key"]
