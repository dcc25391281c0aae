"""``create_app``: a resources-server folder in, a ready ASGI app out.

This is the app-building half of Gym's ``SimpleServer.run_webserver``, in the same order, without its process
side effects: no Ray, no head server, no ``uvicorn.run``, no ulimit or stdout patching, no telemetry. What is
left is a FastAPI app that any ASGI server can run and any router can mount: its session cookie is scoped to its
mount and signed with a real secret, and Gym's function middlewares are pure ASGI (``middleware``).

Gym's launcher starts every server in its own folder (``cd <folder> && python app.py``), and servers open files
relative to it (``prompt_templates/judge.txt``) as they are built; so the server is imported and built with the
folder as the working directory, which is restored once the app is built. A server that opens such a path later, in
a request, needs the process itself in its folder: ``gymhost serve FOLDER`` and ``asgi.py`` put it there.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._config import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    AppSettings,
    MaskedVerdicts,
    NoToken,
    take_secrets,
)
from .._descriptors import sockets_not_inherited
from .._exceptions import FolderError
from .._keys import StateKey
from .._logging import fastmcp_leaves_logging_alone
from .._nemo_gym import require_nemo_gym
from ._folder import ServerSpec, load_server_spec
from ._targets import server_folder

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["HostedServer", "build_app", "create_app"]

logger = logging.getLogger("gymhost")


@dataclass(frozen=True)
class HostedServer:
    """What ``create_app`` built, kept on ``app.state.gymhost`` for hosts and tools to inspect."""

    spec: ServerSpec
    server: Any
    nemo_gym_version: str

    @property
    def name(self) -> str:
        return str(self.server.config.name)


HOSTED: StateKey[HostedServer] = StateKey("gymhost")  # ``app.state.gymhost``


def create_app(
    folder: str | Path,
    *,
    server_urls: Mapping[str, str] | None = None,
    config_key: str | None = None,
    token: str | NoToken | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    metrics: bool = True,
    masked_verdicts: MaskedVerdicts | None = None,
    **overrides: Any,
) -> FastAPI:
    """Build the ASGI app of the resources server in ``folder``: a path, or the name of a Gym server nemo-gym
    installed (as ``gymhost serve`` takes it).

    ``server_urls`` maps the names of other Gym servers this one calls (a judge, a policy model) to their
    base URLs. ``overrides`` set config fields before validation: ``host`` and ``port`` (what the server
    believes it has; default 127.0.0.1:0), ``name`` (the runtime name; default the config's top-level key),
    or any field of the server's own config. ``config_key`` picks the top-level key when a folder's configs
    hold several resources servers.

    ``token``: every request but liveness probes must carry ``Authorization: Bearer <token>``; None reads
    ``GYMHOST_TOKEN`` (unset: no check), ``NO_TOKEN`` turns the check off. Bodies above ``max_body_bytes`` answer
    413; JSON nested deeper than ``max_json_depth``, or holding a lone surrogate escape, answers 400. ``metrics``
    False leaves out the per-request HTTP metrics (``/metrics`` still serves the rest).

    ``masked_verdicts``: how a verdict the server masked (the episode was lost, not failed by the model) reaches the
    client. ``"refuse"`` (the default; None reads ``GYMHOST_MASKED_VERDICTS``) answers it with an HTTP error naming
    the failure, which every client fails the rollout on: verifiers never reads ``mask_sample`` and would train on
    the 0.0 of a 200. ``"answer"`` answers the 200 with ``mask_sample: true``, for clients that read it (Gym 0.5+'s
    rollout collection). The middleware stack this builds is ``gymhost.middleware.stack.middleware_stack``'s; the
    liveness routes (``/``, ``/health``, ``/healthz``, ``/livez``), ``/readyz`` and ``/metrics`` are ``_operating``'s,
    the same on every nemo-gym version.
    """
    settings = AppSettings.of(
        token=token,
        max_body_bytes=max_body_bytes,
        max_json_depth=max_json_depth,
        metrics=metrics,
        masked_verdicts=masked_verdicts,
    )
    return build_app(folder, settings, server_urls=server_urls, config_key=config_key, **overrides)


def build_app(
    folder: str | Path,
    settings: AppSettings,
    *,
    server_urls: Mapping[str, str] | None = None,
    config_key: str | None = None,
    **overrides: Any,
) -> FastAPI:
    """``create_app`` with its guards already decided (``AppSettings``): what a gateway builds its mounts with."""
    take_secrets()  # before the folder's code is imported: nothing it starts inherits them
    sockets_not_inherited()  # nor the server's sockets (an ASGI server makes its own inheritable, for its workers)
    version = require_nemo_gym()
    name = overrides.pop("name", None)
    spec = load_server_spec(server_folder(str(folder)), config_key=config_key, overrides=overrides)
    if spec.env_yaml is not None:  # its values are secrets as often as not: only its keys are said
        logger.info("%s: read %s (%s)", spec.folder.name, spec.env_yaml, ", ".join(sorted(spec.env_values or {})))
    with contextlib.chdir(spec.folder):  # as Gym's launcher runs it: relative paths are the folder's
        return _build(spec, name, server_urls, settings, version)


def _build(
    spec: ServerSpec, name: str | None, server_urls: Mapping[str, str] | None, settings: AppSettings, version: str
) -> FastAPI:
    from .._sessions._signing import secret_mcp_tokens, signing_mcp_tokens_with_secret
    from ..middleware.stack import EpisodeLayers, install_middleware
    from ._entrypoint import find_server_class, import_entrypoint
    from ._folder import referenced_servers
    from ._operating import operate
    from ._routes import hot_routes_first
    from ._server_client import build_server_client, own_aiohttp_client, seed_global_config
    from ._validation_errors import install_validation_errors

    server_class = find_server_class(spec, import_entrypoint(spec))
    urls = dict(server_urls or {})

    config = _validate_config(spec, server_class, name or spec.config_key)
    global_config = seed_global_config(spec, config, urls)
    try:
        server = server_class(config=config, server_client=build_server_client(spec, config, urls))
    except Exception as error:
        raise FolderError(f"{spec.where()}: building {server_class.__name__} failed: {error!r}") from error

    with fastmcp_leaves_logging_alone():  # nemo-gym 0.4.0's MCP servers build a FastMCP app here
        app: FastAPI = server.setup_webserver()
    if getattr(config, "expose_tools_over_mcp", False):
        # nemo-gym >= 0.5 moved MCP out of the server classes into this launch-time step.
        from nemo_gym.mcp_auto_exposure import maybe_auto_expose

        with signing_mcp_tokens_with_secret(server):
            maybe_auto_expose(server, app)
    secret_mcp_tokens(server)
    server.setup_liveness(app)  # as Gym's launcher calls it; ``operate`` then answers liveness in its place
    server.setup_exception_middleware(app)
    if hasattr(server, "setup_cancellation_middleware"):  # 0.5+: outermost, as run_webserver installs it
        server.setup_cancellation_middleware(app)
    own_aiohttp_client(app, global_config)
    operations = operate(app, server)  # after every other lifespan wrapper: ready means all of it started
    episodes = EpisodeLayers(
        starts=frozenset({"/reset"} if _plays_gymnasium(app) else {"/seed_session"}),
        metrics=operations.metrics,
        tracker=operations.tracker,
    )
    install_middleware(app, server_key=server.get_session_middleware_key(), settings=settings, episodes=episodes)
    install_validation_errors(app)
    hot_routes_first(app.router)  # after every route gymhost adds; a written server's tools, added later, again
    HOSTED.set(app, HostedServer(spec=spec, server=server, nemo_gym_version=version))

    unmapped = sorted(set(referenced_servers(spec.block)) - set(urls))
    if unmapped:
        logger.warning(
            "%s refers to Gym servers with no URL: %s; calls to them will fail until each is mapped "
            "(gymhost serve --server-url NAME=URL, or server_urls= in Python)",
            spec.where(),
            ", ".join(unmapped),
        )
    return app


def _plays_gymnasium(app: Any) -> bool:
    """A Gymnasium-style server (nemo-gym 0.7.0's ``GymnasiumServer``): episodes are a ``/reset`` and ``/step``s, with
    no seed or verify."""
    paths = {
        getattr(route, "path", None) for route in app.router.routes if "POST" in (getattr(route, "methods", None) or ())
    }
    return {"/reset", "/step"} <= paths and "/seed_session" not in paths


def _validate_config(spec: ServerSpec, server_class: type[Any], name: str) -> Any:
    from pydantic import ValidationError

    config_class = server_class.model_fields["config"].annotation
    values = {"host": DEFAULT_HOST, "port": 0, **spec.block, "name": name}
    try:
        return config_class.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or '(block)'}: {e['msg']}" for e in error.errors()
        )
        raise FolderError(f"{spec.where()}: not a valid {config_class.__name__}: {problems}") from error
