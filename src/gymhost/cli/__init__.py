"""The ``gymhost`` command line: one module a command, each turning its arguments into a call of the library.

Every error gymhost raises on purpose ends the command with one ``Error: ...`` line and exit status 1; a
traceback means a bug in gymhost. Nothing here imports nemo-gym until a command needs it, so ``--help`` and
the install hint work in an environment without it.
"""

from __future__ import annotations

import difflib
import os

import click

from .._version import __version__
from ._check import check
from ._list import list_servers
from ._requirements import requirements
from ._serve import serve
from ._top import top
from ._write import write

__all__ = ["main"]


class _WriteByDefault(click.Group):
    """``gymhost SOURCE ROOT`` means ``gymhost write SOURCE ROOT``: a first argument that is a source (a URL, an
    existing path, or one written as a path) or an option of ``write``'s is handed to ``write``. Any other word is
    a mistyped command: click's "No such command", with the nearest command's name, and exit status 2 (``gymhost
    foo --help`` printed ``write``'s help and exited 0)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click says "Did you mean" itself from 8.2 on; gymhost allows 8.1, so it says it here, the same way."""
        name = args[0] if args else ""
        if name and name not in self.commands and not name.startswith("-"):
            close = difflib.get_close_matches(name, list(self.commands), n=1)
            ctx.fail(f"No such command '{name}'." + (f" Did you mean '{close[0]}'?" if close else ""))
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = args[0] if args else None
        if first and first not in self.commands and first not in ("-h", "--help", "--version"):
            args = ["write", *args] if _a_source_or_an_option(first) else args
        return super().parse_args(ctx, args)


def _a_source_or_an_option(argument: str) -> bool:
    return (
        argument.startswith(("-", ".", "~", "/")) or "://" in argument or os.sep in argument or os.path.exists(argument)
    )


@click.group(cls=_WriteByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gymhost")
def main() -> None:
    """Serve NeMo Gym resources servers on their own, and write agent environments as Gym servers.

    A first argument that is a source (a URL or a path) runs `write`: `gymhost SOURCE ROOT`.
    """


for _command in (serve, list_servers, requirements, write, check, top):
    main.add_command(_command)
