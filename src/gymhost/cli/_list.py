"""``gymhost list``: the Gym servers there are to serve, and what each needs here."""

from __future__ import annotations

import re
from pathlib import Path

import click

from .._exceptions import FolderError, NemoGymNotInstalledError
from ._common import one_line_errors

__all__ = ["list_servers"]


@click.command("list")
@click.argument("root", required=False, type=click.Path(file_okay=False, path_type=Path))
def list_servers(root: Path | None) -> None:
    """The Gym servers nemo-gym installed (or those of a Gym ROOT), and what serving each needs here.

    \b
    requirements: "met", or the packages of its requirements.txt this environment lacks (serve it with --venv, or
                  install them: gymhost requirements NAME | pip install -r /dev/stdin)
    calls:        the Gym servers it calls by name (a judge, a policy model): give each with --server-url NAME=URL
    """
    from .._hosting._targets import installed_servers, server_folders

    with one_line_errors():
        if root is None:
            base = installed_servers()
            if base is None:
                raise NemoGymNotInstalledError("nemo_gym (whose resources servers `gymhost list` lists)")
        else:
            base = root / "resources_servers" if (root / "resources_servers").is_dir() else root
        folders = server_folders(base)
        if not folders:
            raise FolderError(f"{base}: no resources-server folders (folders with configs/) in it")
    click.echo(f"Gym servers in {base}:")
    rows = [(name, *_needs(folder)) for name, folder in folders.items()]
    width = max(len(name) for name, _, _ in rows)
    needs_width = max(len(needs) for _, needs, _ in rows)
    click.echo(f"{'name':<{width}}  {'requirements':<{needs_width}}  calls")
    for name, needs, calls in rows:
        click.echo(f"{name:<{width}}  {needs:<{needs_width}}  {calls}")
    click.echo(f"{len(rows)} servers; serve one with: gymhost serve NAME")


def _needs(folder: Path) -> tuple[str, str]:
    """What serving ``folder`` needs: the packages it lacks here, and the servers it calls by name."""
    from .._hosting._folder import load_server_spec, referenced_servers
    from .._hosting._requirements import requirements_of

    unmet = [requirement.package for requirement in requirements_of(folder) if not requirement.met]
    requirements = "met" if not unmet else _short("--venv: " + ", ".join(unmet))
    try:
        spec = load_server_spec(folder)
    except FolderError as error:
        missing = re.search(r"Interpolation key '([^']+)'", str(error))
        if missing:
            return requirements, f"? needs ${{{missing.group(1)}}} (env.yaml, or --set)"
        return requirements, _short(f"? {str(error).rsplit(': ', 1)[-1]}")
    calls = sorted(referenced_servers(spec.block))
    return requirements, ", ".join(calls) if calls else "-"


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
