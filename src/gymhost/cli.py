"""The ``gymhost`` command line.

Every error gymhost raises on purpose ends the command with one ``Error: ...`` line and exit status 1; a
traceback means a bug in gymhost. Nothing here imports nemo-gym until a command needs it, so ``--help`` and
the install hint work in an environment without it.
"""

from __future__ import annotations

from typing import Any

import click

from . import __version__
from ._exceptions import GymhostError
from ._serving import SERVERS, ServeConfig, bind_socket, run_app, url_of

__all__ = ["main"]


def _key_values(option: str, values: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise click.BadParameter(f"expected NAME=VALUE, got {value!r}", param_hint=option)
        pairs[key] = rest
    return pairs


def _overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """``--set a.b=1`` as nested config values, typed the way Gym's own command-line overrides are."""
    if not values:
        return {}
    _key_values("--set", values)  # the same NAME=VALUE check as --server-url
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.from_dotlist(list(values)))
    assert isinstance(container, dict)
    return {str(key): value for key, value in container.items()}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gymhost")
def main() -> None:
    """Host NeMo Gym resources servers as standalone ASGI apps."""


@main.command()
@click.argument("folder", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The server checks no token: keep it on loopback or a private network.",
)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--server", "server_name", type=click.Choice(SERVERS), default="uvicorn", show_default=True)
@click.option(
    "--server-url",
    "server_urls",
    multiple=True,
    metavar="NAME=URL",
    help="Where a Gym server this one calls by name (a judge, a policy model) listens. Repeatable.",
)
@click.option("--name", default=None, help="Runtime server name (default: the config's top-level key).")
@click.option("--config-key", default=None, help="Top-level config key, when the configs hold several servers.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Override a config field. Repeatable.")
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def serve(
    folder: str,
    host: str,
    port: int,
    server_name: str,
    server_urls: tuple[str, ...],
    name: str | None,
    config_key: str | None,
    settings: tuple[str, ...],
    log_level: str,
) -> None:
    """Serve the resources server in FOLDER (which may be '.')."""
    from ._app import create_app
    from ._nemo_gym import require_nemo_gym

    urls = _key_values("--server-url", server_urls)
    config = ServeConfig(host=host, port=port, server=server_name, log_level=log_level)  # type: ignore[arg-type]
    try:
        require_nemo_gym()
        overrides = _overrides(settings)
        if name is not None:
            overrides["name"] = name
        sock = bind_socket(config.host, config.port)
        try:
            bound_host, bound_port = sock.getsockname()[:2]
            overrides.update(host=bound_host, port=bound_port)
            app = create_app(folder, server_urls=urls, config_key=config_key, **overrides)
            click.echo(f"gymhost: serving {app.state.gymhost.name} at {url_of(sock)}")
            run_app(app, sock, config)
        finally:
            sock.close()
    except GymhostError as error:
        raise click.ClickException(str(error)) from None
