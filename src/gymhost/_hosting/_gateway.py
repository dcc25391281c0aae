"""One process, many Gym servers: gymhost apps mounted under path prefixes.

Starlette runs the lifespan of the top app only, so a mounted Gym app never starts what its lifespan starts (Gym's
MCP session manager, a written agent environment's instances, the outbound HTTP client). ``mounted_lifespan``
is the missing piece: a lifespan that runs the lifespans of everything mounted on the app. ``create_gateway``
builds a FastAPI app with it, one mount per folder, and a root page listing the servers and their tools.

Each mounted app keeps its sessions to itself: its cookie's path is its prefix and its signature is salted with it
(``_sessions._cookie``), so one client with one cookie jar can play episodes on every mount at once.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.routing import Mount

from .._config import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    AppSettings,
    MaskedVerdicts,
    NoToken,
    take_secrets,
)
from .._exceptions import FolderError, GatewayError
from .._keys import MOUNT, MOUNTS
from .._nemo_gym import GYM_ROUTE_NAMES
from ..middleware.auth import GATEWAY_LIVENESS_PATHS
from ._app import HOSTED, build_app
from ._lifespan import has_lifespan, running_lifespan
from ._operating import add_operating_routes

__all__ = ["build_gateway", "create_gateway", "find_servers", "is_gym_root", "mounted_lifespan"]

logger = logging.getLogger("gymhost")


@asynccontextmanager
async def mounted_lifespan(app: Any) -> AsyncIterator[None]:
    """Run the lifespans of the apps mounted on ``app``, in mount order, and stop them in reverse.

    ``FastAPI(lifespan=mounted_lifespan)``, then ``app.mount("/x", create_app(folder))``. Mounts are read when the
    lifespan starts; an app mounted later runs without its lifespan. To combine with a lifespan of your own,
    ``async with mounted_lifespan(app): ...`` inside it.
    """
    outer = (MOUNT.get(app) or "").rstrip("/")  # where ``app`` is itself mounted, if it is
    mounts = [route for route in app.router.routes if isinstance(route, Mount) and has_lifespan(route.app)]
    progress = _Progress("started", len(mounts))
    async with AsyncExitStack() as stack:
        for route in mounts:
            child: Any = route.app
            MOUNT.set(child, outer + route.path)  # its metrics carry the whole prefix (``_operating``)
            began = time.monotonic()
            await stack.enter_async_context(running_lifespan(route.app))
            progress.one(outer + route.path, time.monotonic() - began)
        yield


def is_gym_root(path: str | Path) -> bool:
    """A folder holding ``resources_servers/<name>/`` folders, as ``gymhost write`` and Gym itself lay them out."""
    return (Path(path) / "resources_servers").is_dir()


def find_servers(root: str | Path) -> dict[str, Path]:
    """``/<name>`` for each ``root/resources_servers/<name>/`` that has configs, in name order."""
    base = Path(root).expanduser().resolve() / "resources_servers"
    if not base.is_dir():
        raise FolderError(f"{base}: no such folder; expected a Gym root holding resources_servers/<name>/ folders")
    folders = {
        f"/{p.name}": p for p in sorted(base.iterdir()) if (p / "configs").is_dir() and not p.name.startswith(".")
    }
    if not folders:
        raise FolderError(f"{base}: no resources-server folders (folders with configs/) in it")
    return folders


def create_gateway(
    servers: Mapping[str, str | Path | Any] | str | Path,
    *,
    server_urls: Mapping[str, str] | None = None,
    token: str | NoToken | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    metrics: bool = True,
    masked_verdicts: MaskedVerdicts | None = None,
) -> Any:
    """A FastAPI app with each server mounted at its prefix and their lifespans run by its own.

    ``servers`` maps prefixes (``"/gridsim"``) to folders or to apps already built with ``create_app``; a path
    instead of a mapping is a Gym root, every ``resources_servers/<name>/`` mounted at ``/<name>``. The result is an
    ordinary FastAPI app: add routes, middleware or more mounts to it. ``GET /`` lists the servers and their tools;
    ``GET /health``, ``/healthz`` and ``/livez`` are the gateway's liveness, ``GET /readyz`` its readiness (every
    mount ready), ``GET /metrics`` every mount's metrics. ``token``, ``max_body_bytes``, ``max_json_depth`` and
    ``masked_verdicts`` are ``create_app``'s, for every mount; the token guards the gateway's own routes and every
    mount, liveness probes excepted. Folders whose ``requirements.txt`` this environment does not meet are refused
    when they clash with another folder's.
    """
    settings = AppSettings.of(
        token=token,
        max_body_bytes=max_body_bytes,
        max_json_depth=max_json_depth,
        metrics=metrics,
        masked_verdicts=masked_verdicts,
    )
    return build_gateway(servers, settings, server_urls=server_urls)


def build_gateway(
    servers: Mapping[str, str | Path | Any] | str | Path,
    settings: AppSettings,
    *,
    server_urls: Mapping[str, str] | None = None,
    apart: Callable[[str, Path], Any] | None = None,
) -> Any:
    """``create_gateway`` with its guards already decided. ``apart(prefix, folder)``, when given, may serve a folder
    elsewhere: it returns the app to mount in its place (``gymhost serve ROOT --venv``: a process of its own, in a
    venv of its own, ``_serving._process_mount``), or None to build it here."""
    from fastapi import FastAPI

    from ..middleware.stack import gateway_stack
    from ._requirements import conflicts

    take_secrets()  # before any folder's code is imported or any process mount starts

    mapping: dict[str, Any] = find_servers(servers) if isinstance(servers, str | Path) else dict(servers)
    for prefix in mapping:
        if not prefix.startswith("/") or prefix.endswith("/") or prefix.count("/") != 1:
            raise GatewayError(f"prefix {prefix!r}: expected one path segment, like '/gridsim'")
    folders = {prefix: Path(value).resolve() for prefix, value in mapping.items() if isinstance(value, str | Path)}
    for prefix, folder in list(folders.items()):
        elsewhere = apart(prefix, folder) if apart is not None else None
        if elsewhere is not None:
            mapping[prefix] = elsewhere
            del folders[prefix]
    problems = conflicts(folders)
    if problems:
        raise GatewayError(
            "these servers cannot share one process: " + "; ".join(problems) + " (or serve the root with --venv: "
            "each folder whose requirements are not met here gets a venv and a process of its own)"
        )

    gateway = FastAPI(title="gymhost gateway", lifespan=mounted_lifespan)
    mounted: dict[str, Any] = {}
    progress = _Progress("built", len(folders))
    for prefix, value in mapping.items():
        if prefix in folders:
            began = time.monotonic()
            mounted[prefix] = build_app(value, settings, server_urls=server_urls)
            progress.one(prefix, time.monotonic() - began)
        else:
            mounted[prefix] = value
        gateway.mount(prefix, mounted[prefix])

    @gateway.get("/", summary="The servers mounted here and their tools")
    async def index() -> dict[str, Any]:
        return {"servers": [_describe(prefix, app) for prefix, app in mounted.items()]}

    MOUNTS.set(gateway, mounted)  # /readyz: ready when every mount is
    # Liveness (a probe written for one server's /livez works here too), /readyz and /metrics for the whole gateway,
    # every mount labelled.
    add_operating_routes(gateway, liveness=sorted(GATEWAY_LIVENESS_PATHS))
    # The folders built here carry the gateway's own stack (they check the token and time their requests); apps
    # built elsewhere are checked here, and timed here unless they time their own.
    timed = {prefix for prefix, app in mounted.items() if prefix in folders or _times_itself(app)}
    others = set(mounted) - set(folders)
    gateway.user_middleware[:] = gateway_stack(settings, mounts=folders, timed=timed, proxied=others)
    return gateway


class _Progress:
    """A gateway of dozens of servers takes a while to build and to start: each one said as it is done (``built
    /gridsim, 3 of 40, in 1.2s``), and, at the end, how long all took and which one was slowest."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done = what, total, 0
        self.began = time.monotonic()
        self.slowest = ("", 0.0)

    def one(self, prefix: str, seconds: float) -> None:
        self.done += 1
        self.slowest = max(self.slowest, (prefix, seconds), key=lambda pair: pair[1])
        logger.info("%s %s, %d of %d, in %.1fs", self.what, prefix, self.done, self.total, seconds)
        if self.done == self.total and self.total > 1:
            logger.info("%s %d servers in %.1fs; the slowest: %s (%.1fs)", self.what, self.total,
                        time.monotonic() - self.began, *self.slowest)  # fmt: skip


def _times_itself(app: Any) -> bool:
    return any(getattr(m.cls, "__name__", "") == "HttpMetricsMiddleware" for m in getattr(app, "user_middleware", []))


def _describe(prefix: str, app: Any) -> dict[str, Any]:
    hosted = HOSTED.get(app)
    routed = {
        route.path.lstrip("/")
        for route in app.router.routes
        if "POST" in (getattr(route, "methods", None) or ())
        and route.path.count("/") == 1
        and "{" not in route.path  # a written server's catch-all that names its tools when called with another
        and route.path.lstrip("/") not in GYM_ROUTE_NAMES
    }
    # nemo-gym 0.4.0's MCP servers have no tool routes: their tools are the methods marked @gym_tool.
    server_class = type(hosted.server) if hosted is not None else object
    marked = {name for name, f in inspect.getmembers(server_class, inspect.isfunction) if getattr(f, "__gym_tool__", 0)}
    return {
        "prefix": prefix,
        "name": hosted.name if hosted is not None else None,
        "folder": str(hosted.spec.folder) if hosted is not None else None,
        "tools": sorted(routed | marked),
        "mcp": any(getattr(route, "path", None) == "/mcp" for route in app.router.routes),
    }
