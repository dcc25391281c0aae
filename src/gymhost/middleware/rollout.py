"""nemo-gym 0.5+'s rollout paths under a mount.

Gym's ``RolloutContextMiddleware`` takes ``/ng-rollout/<id>/...`` off the front of the path and runs the request
under that rollout's context. It matches against the full path, which under a mount still starts with the prefix
(``/gridsim/ng-rollout/...``), so a mounted server never sees its rollout paths. The class made here matches below
the mount prefix (``scope["root_path"]``) and otherwise behaves as Gym's, keeping the path the client sent for a
request that is forwarded to the process owning its session. It subclasses Gym's, so it is made on
demand, where nemo-gym is installed.
"""

from __future__ import annotations

from typing import Any

from .._keys import CLIENT_PATH

__all__ = ["mounted_rollout_middleware"]

_made: Any = None


def mounted_rollout_middleware() -> Any:
    """The mount-aware subclass of nemo-gym's ``RolloutContextMiddleware`` (0.5+ only)."""
    global _made
    if _made is not None:
        return _made
    from nemo_gym.rollout_correlation import RolloutContextMiddleware, rollout_context

    class MountedRolloutContextMiddleware(RolloutContextMiddleware):  # type: ignore[misc]
        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            mount = scope.get("root_path") or ""
            path = scope.get("path", "")
            if scope.get("type") != "http" or not path.startswith(mount):
                await self._app(scope, receive, send)
                return
            match = self._PREFIX.match(path[len(mount) :])
            if match is None:
                await self._app(scope, receive, send)
                return
            rewritten = mount + match.group("rest")
            original = scope.get("raw_path") or path.encode()  # kept: a request forwarded to its owner keeps it
            inner = {**scope, "path": rewritten, "raw_path": rewritten.encode(), CLIENT_PATH.name: original}
            with rollout_context(match.group("rollout_id")):
                await self._app(inner, receive, send)

    _made = MountedRolloutContextMiddleware
    return _made
