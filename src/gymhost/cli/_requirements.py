"""``gymhost requirements``: what serving some folders needs installed here, as pip reads it.

A folder whose ``requirements.txt`` this environment does not meet is served with ``--venv`` (a venv of its own,
built at start). Where nothing can be built at start (a pod's read-only file system, an image that must start in a
second), the same packages are installed ahead instead, into the environment that serves it:
``gymhost requirements FOLDER | pip install -r /dev/stdin`` (``Containerfile.folders`` does that for the folders it
bakes in). Lines gymhost cannot judge (a path, an editable install) are said on stderr and left out."""

from __future__ import annotations

import click

from ._common import one_line_errors

__all__ = ["requirements"]


@click.command("requirements")
@click.argument("paths", nargs=-1, required=True, metavar="FOLDER|ROOT|NAME...")
def requirements(paths: tuple[str, ...]) -> None:
    """The lines of these servers' requirements.txt this environment does not meet, as `pip install -r` reads them
    (a comment names each server); nothing when every one is met.

    \b
    gymhost requirements mcqa | pip install -r /dev/stdin
    """
    from .._hosting._requirements import index_options, requirements_of, unchecked
    from .._hosting._targets import resolve_targets

    with one_line_errors():
        folders = resolve_targets(list(paths)).folders()
    for folder in folders.values():
        for line in unchecked(folder):
            click.echo(f"gymhost: {folder.name}: not judged here, left out: {line}", err=True)
        unmet = [requirement.line for requirement in requirements_of(folder) if not requirement.met]
        if unmet:
            click.echo(f"# {folder.name} ({folder})")
            for line in [*index_options(folder), *unmet]:  # where its packages come from, first
                click.echo(line)
