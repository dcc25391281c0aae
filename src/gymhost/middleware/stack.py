"""The middleware of an app ``create_app`` builds: the whole stack, in one place, outermost first.

Gym's launcher builds its stack in several steps (``setup_webserver`` adds the session middlewares, then
``setup_exception_middleware`` and, on nemo-gym 0.5+, ``setup_cancellation_middleware`` add theirs on top), and
several of its layers do not work under a mount, sign sessions with a public key, or cost a task group per request
(``BaseHTTPMiddleware``). ``create_app`` lets Gym build its app, then replaces the whole list with what
``middleware_stack`` returns: each Gym layer swapped for gymhost's equivalent, gymhost's own layers added, in the
order its docstring gives. Only the layers Gym had are swapped in; a middleware a server's own ``setup_webserver``
added is kept. A gateway's own stack (``gateway_stack``) is here too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.sessions import SessionMiddleware as StarletteSessionMiddleware

from .._config import AppSettings
from .._drain import DrainingMiddleware
from .._metrics import EpisodeMetrics
from .._sessions._cookie import GymSessionMiddleware
from .._sessions._ownership import SessionOwnershipMiddleware
from .auth import GATEWAY_LIVENESS_PATHS, LIVENESS_PATHS, BearerTokenMiddleware
from .disconnect import DisconnectCancellationMiddleware
from .gym_errors import GymErrorsMiddleware
from .masked_verdicts import MaskedVerdictsMiddleware
from .metrics import HttpMetricsMiddleware
from .request_guard import RequestGuardMiddleware
from .rollout import mounted_rollout_middleware
from .tracking import EpisodeTrackingMiddleware, SessionTracker

__all__ = ["EpisodeLayers", "gateway_stack", "install_middleware", "middleware_stack"]


@dataclass(frozen=True)
class EpisodeLayers:
    """What the episode layers (draining, ownership, tracking) need of the app ``create_app`` builds."""

    starts: frozenset[str]  # the POST paths that start an episode: Gym's /seed_session, a Gymnasium-style /reset
    metrics: EpisodeMetrics
    tracker: SessionTracker | None  # None: the server counts its own episodes (a written one)


def middleware_stack(
    gym_stack: Sequence[Middleware], *, server_key: str, settings: AppSettings, episodes: EpisodeLayers
) -> list[Middleware]:
    """The app's middleware, outermost first (the order of Starlette's ``user_middleware``):

    0. ``HttpMetricsMiddleware``, unless ``settings.http_metrics`` is off: outermost, so every answer is timed and
       counted, the refusals of the layers below included.
    1. ``BearerTokenMiddleware``, when a token is set: a request without it is refused before anything reads it,
       its body included. Liveness probes pass, as a load balancer sends them without credentials.
    2. ``RequestGuardMiddleware``: bodies too large, nested too deeply, or not Unicode text are refused before any
       layer below or any handler parses them (each of those would become a 500 further in).
    3. ``DisconnectCancellationMiddleware``, where Gym has its ``ClientDisconnectCancellationMiddleware`` (0.5+):
       the outermost of Gym's layers, as ``run_webserver`` installs it, so a client that leaves cancels everything
       below it.
    4. ``GymErrorsMiddleware``, for Gym's ``exception_handling_middleware``: whatever raises below becomes Gym's
       500 with ``repr(e)``, the answer a model sees when its tool call broke the server.
    5. ``MountedRolloutContextMiddleware``, where Gym has its ``RolloutContextMiddleware`` (0.5+): strips
       ``/ng-rollout/<id>`` below the mount prefix, before the session and the routes see the path.
    6. Middlewares the server's own ``setup_webserver`` added, in their order (Gym's examples add none).
    7. ``GymSessionMiddleware``, for Gym's ``SessionMiddleware`` and ``add_session_id`` pair: next to the routes, as
       in Gym; its cookie is scoped to the mount, signed with the process secret and stamped with its owner.
    8. The episode layers, below the session they read: ``MaskedVerdictsMiddleware``, unless
       ``settings.masked_verdicts`` is ``answer`` (a masked verdict, the server's own or one the layers below give, is
       refused with an HTTP error, never answered as a score), ``DrainingMiddleware`` (a draining process takes no new
       episode), ``SessionOwnershipMiddleware`` (another process's session never reaches a route: it goes to its
       owner, or is answered as lost) and, innermost, ``EpisodeTrackingMiddleware`` (the episodes it sees begin and
       end, for the metrics and the drain).
    """
    layers = _classify(gym_stack)
    stack: list[Middleware] = [Middleware(HttpMetricsMiddleware)] if settings.http_metrics else []
    if settings.token is not None:
        stack.append(Middleware(BearerTokenMiddleware, token=settings.token, open_paths=LIVENESS_PATHS))
    stack.append(
        Middleware(
            RequestGuardMiddleware, max_body_bytes=settings.max_body_bytes, max_json_depth=settings.max_json_depth
        )
    )
    if "disconnect" in layers:
        stack.append(Middleware(DisconnectCancellationMiddleware))
    if "exceptions" in layers:
        stack.append(Middleware(GymErrorsMiddleware, server_key=server_key))
    if "rollout" in layers:
        rollout = layers["rollout"][0]
        stack.append(Middleware(mounted_rollout_middleware(), *rollout.args, **rollout.kwargs))
    stack += layers.get("own", [])
    if "sessions" in layers:
        stack.append(Middleware(GymSessionMiddleware, cookie_name=server_key))
    if settings.masked_verdicts == "refuse":
        stack.append(Middleware(MaskedVerdictsMiddleware, metrics=episodes.metrics))
    stack += [
        Middleware(DrainingMiddleware, starts=episodes.starts),
        Middleware(SessionOwnershipMiddleware, server_key=server_key, starts=episodes.starts, metrics=episodes.metrics),
        Middleware(
            EpisodeTrackingMiddleware, starts=episodes.starts, metrics=episodes.metrics, tracker=episodes.tracker
        ),
    ]
    return stack


def gateway_stack(
    settings: AppSettings, *, mounts: Collection[str], timed: Collection[str], proxied: Collection[str]
) -> list[Middleware]:
    """A gateway's own middleware, outermost first: ``HttpMetricsMiddleware`` and, with a token,
    ``BearerTokenMiddleware``, as for an app, so its own routes (``/``, ``/readyz``, ``/metrics``) and its refusals
    are timed and checked. The ``mounts`` it built carry this same token in their own stack, and the ``timed`` ones
    time their own requests: here they pass. The others (apps built elsewhere, folders served by processes of their
    own) are checked here, their liveness probes open as when served alone."""
    stack = [Middleware(HttpMetricsMiddleware, mounts=timed)] if settings.http_metrics else []
    if settings.token is not None:
        open_paths = (
            GATEWAY_LIVENESS_PATHS
            | {"/readyz"}
            | {prefix + path for prefix in proxied for path in LIVENESS_PATHS | {""}}
        )
        stack.append(Middleware(BearerTokenMiddleware, token=settings.token, open_paths=open_paths, mounts=mounts))
    return stack


def install_middleware(app: Any, *, server_key: str, settings: AppSettings, episodes: EpisodeLayers) -> None:
    """Replace the stack Gym built on ``app`` with ``middleware_stack``'s, before the first request builds it."""
    app.user_middleware[:] = middleware_stack(
        app.user_middleware, server_key=server_key, settings=settings, episodes=episodes
    )


def _classify(gym_stack: Sequence[Middleware]) -> dict[str, list[Middleware]]:
    """Gym's layers by the role ``middleware_stack`` gives them; ``own`` holds the ones Gym did not add."""
    layers: dict[str, list[Middleware]] = {}
    for middleware in gym_stack:
        layers.setdefault(_role(middleware), []).append(middleware)
    layers.pop("drop", None)
    return layers


def _role(middleware: Middleware) -> str:
    factory: Any = middleware.cls  # typed as a factory; for these entries it is the class itself
    name = getattr(factory, "__name__", "")
    if factory is StarletteSessionMiddleware:
        return "sessions"
    if factory is MaskedVerdictsMiddleware:
        return "drop"  # a written server's own, for Gym's launcher: gymhost places its own, as its settings say
    if factory is BaseHTTPMiddleware:
        dispatch = getattr(middleware.kwargs.get("dispatch"), "__name__", "")
        if dispatch == "add_session_id":
            return "drop"  # gymhost's SessionMiddleware gives every session its id
        if dispatch == "exception_handling_middleware":
            return "exceptions"
    if name == "ClientDisconnectCancellationMiddleware":
        return "disconnect"
    if name == "RolloutContextMiddleware":
        return "rollout"
    return "own"
