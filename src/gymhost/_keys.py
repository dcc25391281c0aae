"""What gymhost keeps on a request's ASGI scope and on an app's state, each under one typed key (as aiohttp's
``AppKey`` does), so a reader finds every such entry here and mypy knows the type of each.

Scope entries travel with one request through the middleware; state entries stay with an app for its life. The two
state keys whose values are the hosting layer's own types are defined beside those types, so this module imports
nothing of gymhost: ``_hosting._app.HOSTED`` (what ``create_app`` built) and ``_hosting._operating.OPERATIONS``
(readiness, metrics, open episodes).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, cast

__all__ = ["BODY", "CLIENT_PATH", "FORWARDED", "MOUNT", "MOUNTS", "UNVERIFIED_OWNER", "ScopeKey", "StateKey"]

_MISSING = object()


class ScopeKey[T]:
    """An entry of an ASGI scope (a dict every layer below sees)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, scope: MutableMapping[str, Any]) -> T | None:
        return cast("T | None", scope.get(self.name))

    def set(self, scope: MutableMapping[str, Any], value: T) -> None:
        scope[self.name] = value

    def pop(self, scope: MutableMapping[str, Any]) -> T | None:
        return cast("T | None", scope.pop(self.name, None))


class StateKey[T]:
    """An attribute of an app's ``state`` (Starlette's ``State``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, app: Any) -> T | None:
        value = getattr(app.state, self.name, _MISSING)
        return None if value is _MISSING else cast("T", value)

    def set(self, app: Any, value: T) -> None:
        setattr(app.state, self.name, value)


# -- on a request (scope) ---------------------------------------------------------------------------------------

# The body, read by a layer that needed it (a forward that could not be made), for the layers below to read again.
BODY: ScopeKey[bytes] = ScopeKey("gymhost.body")
# Set when the answer is another process's (``_sessions._forwarding``): its cookie is the owner's, its route unknown.
FORWARDED: ScopeKey[bool] = ScopeKey("gymhost.forwarded")
# The path as the client sent it, before a rollout prefix was taken off (a forward sends this one).
CLIENT_PATH: ScopeKey[bytes] = ScopeKey("gymhost.raw_path")
# A session cookie gymhost signed that this process cannot verify (another secret: a restart without a kept secret,
# a replica with another): the owner its unchecked payload names. Its episode is lost (``_sessions._ownership``).
UNVERIFIED_OWNER: ScopeKey[Any] = ScopeKey("gymhost.unverified_owner")

# -- on an app (state) ------------------------------------------------------------------------------------------

MOUNT: StateKey[str] = StateKey("gymhost_mount")  # the prefix a gateway (or a proxy) serves the app under
MOUNTS: StateKey[dict[str, Any]] = StateKey("gymhost_mounts")  # a gateway's apps, by prefix
