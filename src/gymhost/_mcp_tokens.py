"""MCP session tokens signed with the process secret instead of Gym's public string, and carrying their owner.

nemo-gym signs the token of an MCP session with the server's public ``<Class>___<name>``, so anyone can forge one.
gymhost signs them with a key derived from the process secret and that string (``_secret.server_secret``): a token
of one server is no token at another, and nobody can make one up. Each token also carries the process that minted
it (``_process``): a token that reaches another replica, or this one after a restart, is refused as a lost session
(``middleware.ownership``) instead of naming a session that process never had. Gym's code sees the payload it
signed, unchanged: the owner travels in an envelope around it.

nemo-gym 0.4.0 keeps the serializer on the class-based MCP server (``_mcp_token_serializer``); 0.5+'s auto-exposure
builds one when it is installed, from ``get_session_middleware_key()`` and ``URLSafeSerializer``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from itsdangerous import URLSafeSerializer

from ._process import process_state
from ._secret import server_secret

__all__ = [
    "TOKEN_HEADER",
    "OwnedSerializer",
    "secret_mcp_tokens",
    "signing_mcp_tokens_with_secret",
    "token_owner",
]

TOKEN_HEADER = "x-nemo-gym-session-token"  # nemo_gym.base_resources_server.NEMO_GYM_MCP_SESSION_TOKEN_HEADER
_SALT = "nemo-gym-mcp-session-token"  # nemo_gym.base_resources_server._MCP_TOKEN_SALT
_OWNER = "gymhost_owner"
_PAYLOAD = "payload"


class OwnedSerializer(URLSafeSerializer):
    """Gym's token serializer, with the minting process's owner stamp around the payload."""

    def dumps(self, obj: Any, salt: Any = None) -> Any:
        return super().dumps({_OWNER: process_state.owner(), _PAYLOAD: obj}, salt)

    def loads(self, s: Any, salt: Any = None, **kwargs: Any) -> Any:
        data = super().loads(s, salt, **kwargs)
        return data[_PAYLOAD] if isinstance(data, dict) and _OWNER in data else data


def token_owner(server_key: str, token: str) -> tuple[bool, Any]:
    """(whether the token is validly signed for this server, the owner it names)."""
    try:
        data = URLSafeSerializer(server_secret(server_key), salt=_SALT).loads(token)
    except Exception:  # a forged or garbled token: Gym's own check answers it
        return False, None
    return True, data.get(_OWNER) if isinstance(data, dict) else None


def secret_mcp_tokens(server: Any) -> None:
    """nemo-gym 0.4.0: sign the class-based MCP server's session tokens with the process secret and the owner."""
    if not hasattr(server, "_mcp_token_serializer"):
        return
    serializer = OwnedSerializer(server_secret(server.get_session_middleware_key()), salt=_SALT)
    object.__setattr__(server, "_mcp_token_serializer", lambda: serializer)


@contextlib.contextmanager
def signing_mcp_tokens_with_secret(server: Any) -> Iterator[None]:
    """nemo-gym 0.5+: auto-exposure builds its token serializer from ``get_session_middleware_key()`` and
    ``URLSafeSerializer`` when it is installed; for that moment they are this server's secret and
    ``OwnedSerializer``. Everything else keeps reading the public name."""
    from nemo_gym import mcp_auto_exposure

    secret = server_secret(server.get_session_middleware_key())
    key: Callable[[], str] = lambda: secret  # noqa: E731
    object.__setattr__(server, "get_session_middleware_key", key)
    original = mcp_auto_exposure.URLSafeSerializer
    mcp_auto_exposure.URLSafeSerializer = OwnedSerializer
    try:
        yield
    finally:
        mcp_auto_exposure.URLSafeSerializer = original
        del server.__dict__["get_session_middleware_key"]
