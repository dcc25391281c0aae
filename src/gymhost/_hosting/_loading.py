"""The one way to turn a path into an app: a resources-server folder, or a Gym root of several.

``gymhost serve PATH`` and ``GYMHOST_FOLDER=PATH uvicorn asgi:app`` both come here, so both accept the same paths
and give the same app for them, and both run in the folder of a single server, as Gym's launcher does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._config import AppSettings
from .._exceptions import GatewayError
from ._app import build_app
from ._gateway import build_gateway, is_gym_root

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
    path: str | Path | Mapping[str, str | Path],
    settings: AppSettings | None = None,
    *,
    server_urls: Mapping[str, str] | None = None,
    config_key: str | None = None,
    address: tuple[str, int] | None = None,
    apart: Callable[[str, Path], Any] | None = None,
    **overrides: Any,
) -> Any:
    """A gateway when ``path`` is a Gym root (it holds ``resources_servers/<name>/``), with every server at
    ``/<name>``, or a mapping of prefixes to folders (``{"/gridsim": folder}``); else the app of the one server in
    ``path``. ``settings``: what the app guards and measures (default:
    ``create_app``'s, the token from ``GYMHOST_TOKEN``). ``config_key`` and ``overrides`` name one server's config,
    so they are refused for a root. ``address``: the host and port the server listens on, which a single server is
    told (its config's ``host`` and ``port``). ``apart``: a root's folders it returns an app for are served by that
    app (``build_gateway``)."""
    settings = settings if settings is not None else AppSettings.of()
    if isinstance(path, Mapping) or is_gym_root(path):
        if config_key is not None or overrides:
            given = ", ".join(["config_key", *overrides] if config_key is not None else overrides)
            raise GatewayError(f"{path}: is a Gym root of several servers; {given} apply to one server's folder")
        return build_gateway(path, settings, server_urls=server_urls, apart=apart)
    if address is not None:
        overrides = {**overrides, "host": address[0], "port": address[1]}
    return build_app(path, settings, server_urls=server_urls, config_key=config_key, **overrides)
