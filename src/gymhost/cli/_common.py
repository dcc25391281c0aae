"""What the commands share: ``NAME=VALUE`` options, and gymhost's errors as one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click

from .._exceptions import GymhostError, NemoGymNotInstalledError

__all__ = ["key_values", "one_line_errors", "overrides"]


def key_values(option: str, values: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise click.BadParameter(f"expected NAME=VALUE, got {value!r}", param_hint=option)
        pairs[key] = rest
    return pairs


def overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """``--set a.b=1`` as nested config values, typed the way Gym's own command-line overrides are."""
    if not values:
        return {}
    key_values("--set", values)  # the same NAME=VALUE check as --server-url
    import importlib.util

    if importlib.util.find_spec("omegaconf") is None:
        raise NemoGymNotInstalledError("omegaconf")
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.from_dotlist(list(values)))
    assert isinstance(container, dict)
    return {str(key): value for key, value in container.items()}


class _JsonError(click.ClickException):
    """An error said as a record of the ``gymhost`` logger, for a command whose log is JSON lines."""

    def show(self, file: IO[Any] | None = None) -> None:
        from .._logging import error_line

        click.echo(error_line(self.format_message(), "json"), file=file, err=file is None)


@contextmanager
def one_line_errors(log_format: str = "text") -> Iterator[None]:
    """gymhost's own errors end the command with one ``Error:`` line, exit status 1; under ``--log-format json``,
    with one JSON record, like every other line of it."""
    try:
        yield
    except GymhostError as error:
        raise (_JsonError if log_format == "json" else click.ClickException)(str(error)) from None
