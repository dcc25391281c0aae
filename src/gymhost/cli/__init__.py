"""The ``gymhost`` command line: one module a command, each turning its arguments into a call of the library.

Every error gymhost raises on purpose ends the command with one ``Error: ...`` line and exit status 1; a
traceback means a bug in gymhost. Nothing here imports nemo-gym until a command needs it, so ``--help`` and
the install hint work in an environment without it.
"""

from __future__ import annotations

import click

from .._version import __version__
from ._check import check
from ._list import list_servers
from ._serve import serve
from ._write import write

__all__ = ["main"]


class _WriteByDefault(click.Group):
    """``gymhost SOURCE ROOT`` means ``gymhost write SOURCE ROOT``: a first argument that is not a command (or
    the group's own --help/--version) is handed to ``write``, options before SOURCE included."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help", "--version"):
            args = ["write", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_WriteByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gymhost")
def main() -> None:
    """Serve NeMo Gym resources servers on their own, and write agent environments as Gym servers.

    A first argument that is not a command runs `write`: `gymhost SOURCE ROOT`.
    """


for _command in (serve, list_servers, write, check):
    main.add_command(_command)
