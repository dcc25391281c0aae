"""The one way to turn a path into an app: a resources-server folder, or a Gym root of several.

``gymhost serve PATH`` and ``GYMHOST_FOLDER=PATH uvicorn asgi:app`` both come here, so both accept the same paths
and give the same app for them, and both run in the folder of a single server, as Gym's launcher does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._app import create_app
from ._config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, NoToken, ServeConfig
from ._exceptions import GatewayError
from ._gateway import create_gateway, is_gym_root

__all__ = ["enter_folder", "load_app"]


def enter_folder(path: str | Path) -> Path:
    """For a process that serves one folder: make the folder its working directory, as Gym's launcher does
    (``cd <folder> && python app.py``), so a server that opens a relative path while it serves finds it. A Gym root
    of several servers leaves the directory alone (each server is built in its own, ``create_app``). Returns the
    path, absolute when it is a folder."""
    given = Path(path).expanduser()
    if not given.is_dir() or is_gym_root(given):
        return given  # not there: the loading says so, in the words it was given
    resolved = given.resolve()
    os.chdir(resolved)
    return resolved


def load_app(
    path: str | Path,
    *,
    server_urls: Mapping[str, str] | None = None,
    token: str | NoToken | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    metrics: bool = True,
    config_key: str | None = None,
    address: tuple[str, int] | None = None,
    own_venvs: ServeConfig | None = None,
    **overrides: Any,
) -> Any:
    """``create_gateway(path)`` when ``path`` is a Gym root (it holds ``resources_servers/<name>/``), with every
    server at ``/<name>``; else ``create_app(path)``. ``config_key`` and ``overrides`` name one server's config, so
    they are refused for a root. ``address``: the host and port the server listens on, which a single server is
    told (its config's ``host`` and ``port``). ``own_venvs``: a root's folders whose requirements this environment
    does not meet are served from venvs of their own, by processes run as it says (``create_gateway``)."""
    guards: dict[str, Any] = {
        "token": token,
        "max_body_bytes": max_body_bytes,
        "max_json_depth": max_json_depth,
        "metrics": metrics,
    }
    if is_gym_root(path):
        if config_key is not None or overrides:
            given = ", ".join(["config_key", *overrides] if config_key is not None else overrides)
            raise GatewayError(f"{path}: is a Gym root of several servers; {given} apply to one server's folder")
        return create_gateway(path, server_urls=server_urls, own_venvs=own_venvs, **guards)
    if address is not None:
        overrides = {**overrides, "host": address[0], "port": address[1]}
    return create_app(path, server_urls=server_urls, config_key=config_key, **guards, **overrides)
