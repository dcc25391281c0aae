"""One process, many Gym servers: gymhost apps mounted under path prefixes.

Starlette runs the lifespan of the top app only, so a mounted Gym app never starts what its lifespan starts (Gym's
MCP session manager, a written agent environment's instances, the outbound HTTP client). ``mounted_lifespan``
is the missing piece: a lifespan that runs the lifespans of everything mounted on the app. ``create_gateway``
builds a FastAPI app with it, one mount per folder, and a root page listing the servers and their tools.

Each mounted app keeps its sessions to itself: its cookie's path is its prefix and its signature is salted with it
(see ``_sessions``), so one client with one cookie jar can play episodes on every mount at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.routing import Mount

from ._app import create_app
from ._config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, NO_TOKEN, NoToken, ServeConfig
from ._exceptions import FolderError, GatewayError
from ._lifespan_runner import has_lifespan, running_lifespan
from ._nemo_gym import GYM_ROUTE_NAMES
from ._operating import add_operating_routes
from .middleware.auth import LIVENESS_PATHS, BearerTokenMiddleware, resolve_token

__all__ = ["create_gateway", "find_servers", "is_gym_root", "mounted_lifespan"]


@asynccontextmanager
async def mounted_lifespan(app: Any) -> AsyncIterator[None]:
    """Run the lifespans of the apps mounted on ``app``, in mount order, and stop them in reverse.

    ``FastAPI(lifespan=mounted_lifespan)``, then ``app.mount("/x", create_app(folder))``. Mounts are read when the
    lifespan starts; an app mounted later runs without its lifespan. To combine with a lifespan of your own,
    ``async with mounted_lifespan(app): ...`` inside it.
    """
    async with AsyncExitStack() as stack:
        for route in app.router.routes:
            if isinstance(route, Mount) and has_lifespan(route.app):
                child: Any = route.app
                child.state.gymhost_mount = route.path  # its metrics carry the mount (``_operating``)
                await stack.enter_async_context(running_lifespan(route.app))
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
    own_venvs: ServeConfig | None = None,
) -> Any:
    """A FastAPI app with each server mounted at its prefix and their lifespans run by its own.

    ``servers`` maps prefixes (``"/gridsim"``) to folders or to apps already built with ``create_app``; a path
    instead of a mapping is a Gym root, every ``resources_servers/<name>/`` mounted at ``/<name>``. The result is an
    ordinary FastAPI app: add routes, middleware or more mounts to it. ``GET /`` lists the servers and their tools;
    ``GET /health`` is the gateway's liveness, ``GET /readyz`` its readiness (every mount ready), ``GET /metrics``
    every mount's metrics. ``token``, ``max_body_bytes`` and ``max_json_depth`` are ``create_app``'s; the token
    guards the gateway's own routes and every mount, liveness probes excepted.

    Folders whose ``requirements.txt`` this environment does not meet are refused when they clash with another
    folder's; with ``own_venvs`` (how ``gymhost serve`` runs: ``gymhost serve ROOT --venv``), each is served instead
    from a venv of its own by a process of its own behind the gateway, at its prefix (``_process_mount``).
    """
    from fastapi import FastAPI

    from ._requirements import conflicts

    mapping: dict[str, Any] = find_servers(servers) if isinstance(servers, str | Path) else dict(servers)
    for prefix in mapping:
        if not prefix.startswith("/") or prefix.endswith("/") or prefix.count("/") != 1:
            raise GatewayError(f"prefix {prefix!r}: expected one path segment, like '/gridsim'")
    folders = {prefix: Path(value).resolve() for prefix, value in mapping.items() if isinstance(value, str | Path)}
    if own_venvs is not None:
        from ._process_mount import ProcessMount
        from ._venvs import folder_venv, unmet_requirements

        for prefix, folder in list(folders.items()):
            if unmet_requirements(folder):
                mapping[prefix] = ProcessMount(folder, folder_venv(folder), prefix, own_venvs, server_urls or {})
                del folders[prefix]
    problems = conflicts(folders)
    if problems:
        raise GatewayError(
            "these servers cannot share one process: " + "; ".join(problems) + " (or serve the root with --venv: "
            "each folder whose requirements are not met here gets a venv and a process of its own)"
        )

    required = resolve_token(token)
    gateway = FastAPI(title="gymhost gateway", lifespan=mounted_lifespan)
    mounted: dict[str, Any] = {}
    for prefix, value in mapping.items():
        if isinstance(value, str | Path):
            value = create_app(
                value,
                server_urls=server_urls,
                token=NO_TOKEN,  # the gateway checks it, for every mount
                max_body_bytes=max_body_bytes,
                max_json_depth=max_json_depth,
                metrics=metrics,
            )
        mounted[prefix] = value
        gateway.mount(prefix, value)

    @gateway.get("/", summary="The servers mounted here and their tools")
    async def index() -> dict[str, Any]:
        return {"servers": [_describe(prefix, app) for prefix, app in mounted.items()]}

    @gateway.get("/health", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    gateway.state.gymhost_mounts = mounted  # /readyz: ready when every mount is
    add_operating_routes(gateway)  # /readyz and /metrics for the whole gateway, every mount labelled

    if required is not None:
        # The mounts' own liveness probes stay open through the gateway, as they are when served alone.
        open_paths = {"/health", "/readyz"} | {prefix + path for prefix in mounted for path in LIVENESS_PATHS | {""}}
        gateway.add_middleware(BearerTokenMiddleware, token=required, open_paths=open_paths)
    return gateway


def _describe(prefix: str, app: Any) -> dict[str, Any]:
    hosted = getattr(app.state, "gymhost", None)
    tools = sorted(
        route.path.lstrip("/")
        for route in app.router.routes
        if "POST" in (getattr(route, "methods", None) or ())
        and route.path.count("/") == 1
        and "{" not in route.path  # a written server's catch-all that names its tools when called with another
        and route.path.lstrip("/") not in GYM_ROUTE_NAMES
    )
    return {
        "prefix": prefix,
        "name": hosted.name if hosted is not None else None,
        "folder": str(hosted.spec.folder) if hosted is not None else None,
        "tools": tools,
    }
