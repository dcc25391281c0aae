"""What this process signs with, and the MCP session tokens it signs.

The secret: ``GYMHOST_SECRET`` when set; else one gymhost made and keeps in a file only this user can read
(``_config.secret_file``), so that this server's next start on this machine still verifies the cookies and tokens
of the last one and answers their episodes as lost, not as new; else (no such file can be written: a read-only
home) a random secret of this process alone. Session cookies (``_sessions._cookie``) and MCP tokens are signed with
it. Several replicas serving the same clients must share ``GYMHOST_SECRET``, or each answers the others' episodes as
lost instead of forwarding them (a cookie signed with another secret is refused as lost, ``_sessions._ownership``).

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
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from itsdangerous import URLSafeSerializer

from .._config import SECRET_ENV_VAR, configured_secret, secret_file
from ._identity import process_state
from ._owner import OWNER_KEY, TOKEN_HEADER, owner_of, stamp, unchecked_token_owner

__all__ = [
    "TOKEN_HEADER",
    "OwnedSerializer",
    "describe_secret",
    "process_secret",
    "secret_mcp_tokens",
    "server_secret",
    "signing_mcp_tokens_with_secret",
    "token_owner",
]


@dataclass(frozen=True)
class _Made:
    """The secret gymhost made: where it is kept (None: nowhere, and why)."""

    value: str
    kept_in: Path | None
    why_not_kept: str = ""


_made: _Made | None = None


def process_secret() -> str:
    """``GYMHOST_SECRET``, else the secret kept in ``secret_file()`` (made there at the first start), else a random
    secret of this process; read once, then the same for the life of the process."""
    configured = configured_secret()
    if configured:
        return configured
    return _made_secret().value


def describe_secret() -> str:
    """What sessions are signed with, for a server's start line: where a restart finds it, and what replicas need."""
    if configured_secret():
        return f"sessions are signed with {SECRET_ENV_VAR}"
    made = _made_secret()
    if made.kept_in is not None:
        return (
            f"sessions are signed with the secret kept in {made.kept_in} (a restart here keeps them verifiable); "
            f"replicas behind one load balancer must share one: set {SECRET_ENV_VAR}"
        )
    return (
        f"WARNING: sessions are signed with a secret of this start alone ({made.why_not_kept}): a restart answers "
        f"every open episode as lost; set {SECRET_ENV_VAR}, the same on every replica"
    )


def _made_secret() -> _Made:
    global _made
    if _made is None:
        path = secret_file()
        try:
            if path is None:
                raise OSError(0, "this user has no home directory and XDG_STATE_HOME is unset")
            _made = _Made(_kept_secret(path), path)
        except OSError as error:
            reason = error.strerror or str(error)
            where = f"{path} could not be kept" if path is not None else "no place to keep one"
            _made = _Made(secrets.token_urlsafe(32), None, f"{where}: {reason}")
    return _made


def _kept_secret(path: Path) -> str:
    """The secret in ``path``, made there first if there is none (atomically: servers starting at once, workers or
    tests, all end up with the first one made)."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        made = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(32) + "\n")
            with contextlib.suppress(FileExistsError):  # another start made it first: its secret is the one
                os.link(made, path)
        finally:
            made.unlink()
    status = path.stat()
    if status.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or status.st_uid != os.getuid():
        raise PermissionError(0, f"another user may read or change it (mode {stat.filemode(status.st_mode)})")
    value = path.read_text().strip()
    if not value:
        raise OSError(0, "it is empty")
    return value


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
    """(whether the token is validly signed for this server, the owner it names: unchecked when it is not, and None
    when it is not gymhost's)."""
    try:
        data = URLSafeSerializer(server_secret(server_key), salt=_SALT).loads(token)
    except Exception:  # another secret's token (its owner named), or a forged or garbled one: Gym's check answers it
        return False, unchecked_token_owner(token.encode("latin-1"))
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
