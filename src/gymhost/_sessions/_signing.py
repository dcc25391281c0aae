"""What this process signs with, and the MCP session tokens it signs.

The secret: ``GYMHOST_SECRET`` when set, else a random secret made once per process; session cookies
(``_sessions._cookie``) and MCP tokens are signed with it. Several workers or replicas serving the same clients
must share ``GYMHOST_SECRET``, or each refuses the others' cookies and tokens.

MCP session tokens: nemo-gym signs the token of an MCP session with the server's public ``<Class>___<name>``, so
anyone can forge one. gymhost signs them with a key derived from the secret and that string (``server_secret``): a
token of one server is no token at another, and nobody can make one up. Each token also carries the process that
minted it (``_identity``): a token that reaches another replica, or this one after a restart, is refused as a lost
session (``_sessions._ownership``) instead of naming a session that process never had. Gym's code sees the payload it
signed, unchanged: the owner travels in an envelope around it. nemo-gym 0.4.0 keeps the serializer on the
class-based MCP server (``_mcp_token_serializer``); 0.5+'s auto-exposure builds one when it is installed, from
``get_session_middleware_key()`` and ``URLSafeSerializer``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from itsdangerous import URLSafeSerializer

from .._config import configured_secret
from ._identity import process_state
from ._owner import OWNER_KEY, TOKEN_HEADER, owner_of, stamp

__all__ = [
    "TOKEN_HEADER",
    "OwnedSerializer",
    "process_secret",
    "secret_mcp_tokens",
    "server_secret",
    "signing_mcp_tokens_with_secret",
    "token_owner",
]

_random_secret: str | None = None


def process_secret() -> str:
    """``GYMHOST_SECRET``, else a random secret made on first use and kept for the life of the process."""
    global _random_secret
    configured = configured_secret()
    if configured:
        return configured
    if _random_secret is None:
        _random_secret = secrets.token_urlsafe(32)
    return _random_secret


def server_secret(server_key: str) -> str:
    """A key of one server's own (its public ``<Class>___<name>``), derived from the process secret: what one
    server signs (an MCP session token) means nothing to another."""
    return hmac.new(process_secret().encode(), server_key.encode(), hashlib.sha256).hexdigest()


_SALT = "nemo-gym-mcp-session-token"  # nemo_gym.base_resources_server._MCP_TOKEN_SALT
_PAYLOAD = "payload"


class OwnedSerializer(URLSafeSerializer):
    """Gym's token serializer, with the minting process's owner stamp around the payload."""

    def dumps(self, obj: Any, salt: Any = None) -> Any:
        envelope: dict[str, Any] = {_PAYLOAD: obj}
        stamp(envelope, process_state.owner())
        return super().dumps(envelope, salt)

    def loads(self, s: Any, salt: Any = None, **kwargs: Any) -> Any:
        data = super().loads(s, salt, **kwargs)
        return data[_PAYLOAD] if isinstance(data, dict) and OWNER_KEY in data else data


def token_owner(server_key: str, token: str) -> tuple[bool, Any]:
    """(whether the token is validly signed for this server, the owner it names)."""
    try:
        data = URLSafeSerializer(server_secret(server_key), salt=_SALT).loads(token)
    except Exception:  # a forged or garbled token: Gym's own check answers it
        return False, None
    return True, owner_of(data)


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
