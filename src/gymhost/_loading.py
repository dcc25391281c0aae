"""The one way to turn a path into an app: a resources-server folder, or a Gym root of several.

``gymhost serve PATH`` and ``GYMHOST_FOLDER=PATH uvicorn asgi:app`` both come here, so both accept the same paths
and give the same app for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._app import create_app
from ._config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, NoToken
from ._exceptions import GatewayError
from ._gateway import create_gateway, is_gym_root

__all__ = ["load_app"]


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
    **overrides: Any,
) -> Any:
    """``create_gateway(path)`` when ``path`` is a Gym root (it holds ``resources_servers/<name>/``), with every
    server at ``/<name>``; else ``create_app(path)``. ``config_key`` and ``overrides`` name one server's config, so
    they are refused for a root. ``address``: the host and port the server listens on, which a single server is
    told (its config's ``host`` and ``port``)."""
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
        return create_gateway(path, server_urls=server_urls, **guards)
    if address is not None:
        overrides = {**overrides, "host": address[0], "port": address[1]}
    return create_app(path, server_urls=server_urls, config_key=config_key, **guards, **overrides)
