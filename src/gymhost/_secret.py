"""The process's signing secret: one place that decides what session cookies and MCP tokens are signed with.

``GYMHOST_SECRET`` when set, else a random secret made once per process. Several workers or replicas serving the
same clients must share ``GYMHOST_SECRET``, or each refuses the others' cookies and tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from ._config import SECRET_ENV_VAR

__all__ = ["process_secret", "server_secret"]

_random_secret: str | None = None


def process_secret() -> str:
    """``GYMHOST_SECRET``, else a random secret made on first use and kept for the life of the process."""
    global _random_secret
    configured = os.environ.get(SECRET_ENV_VAR)
    if configured:
        return configured
    if _random_secret is None:
        _random_secret = secrets.token_urlsafe(32)
    return _random_secret


def server_secret(server_key: str) -> str:
    """A key of one server's own (its public ``<Class>___<name>``), derived from the process secret: what one
    server signs (an MCP session token) means nothing to another."""
    return hmac.new(process_secret().encode(), server_key.encode(), hashlib.sha256).hexdigest()
