"""``gymhost write``: an agent environment (a bundle, or a server at a URL) written as a Gym resources-server folder."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from .._terminal import redraws_in_place
from ..environments._settings import DEFAULT_MODE, parse_instances
from ._common import one_line_errors

__all__ = ["write"]


def _instances(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_instances(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
    return value


class _InstancesOption(click.Option):
    """``--instances``, whose help names each source kind's default, read from the backends when the help is shown
    (so ``gymhost --help`` imports none of them)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:
            return None
        from ..environments._registry import BACKENDS

        defaults = ", ".join(
            f"{low}:{high} {backend.kind}{f' {mode}' if mode else ''}".replace("_", "-")
            for backend in BACKENDS
            for mode, (low, high) in backend.default_instances.items()
        )
        return record[0], f"{record[1]} Default: {defaults}."


@click.command()
@click.argument("source")
@click.argument("root", type=click.Path(file_okay=False, path_type=str))
@click.option("--name", default=None, help="Folder and server name (default: the bundle's folder name or the card's).")
@click.option("--split", default=None, help="Only this split's tasks (bundle), or the split name for --tasks.")
@click.option("--tasks", "tasks_file", type=click.Path(dir_okay=False, path_type=str), help="Tasks of a URL source.")
@click.option("--url", "urls", multiple=True, metavar="URL", help="Another instance of a URL source. Repeatable.")
@click.option(
    "--instances",
    cls=_InstancesOption,
    default=None,
    metavar="K|MIN:MAX",
    callback=_instances,
    help="A bundle's instances or an OpenEnv server's sessions (= episodes at once): K for a fixed pool, MIN:MAX "
    "for one that grows on demand and shrinks when idle.",
)
@click.option(
    "--mode",
    type=click.Choice(["process", "in-process"]),
    default=DEFAULT_MODE,
    show_default=True,
    help="Bundle instances as processes of their own, or inside the server (for thousands of episodes at once).",
)
@click.option(
    "--prompt-field",
    default=None,
    metavar="POINTER",
    help="OpenEnv: where tasks keep their prompts, a JSON pointer into the task, then into the reset observation "
    "(default: the task's /prompt, then the observation's /metadata/prompt).",
)
@click.option(
    "--python",
    default=None,
    metavar="PATH",
    help="An agent-env bundle: the Python of a venv with agentenv-framework[openenv], which runs agent-env's OpenEnv "
    "app for it (default: $GYMHOST_AGENT_ENV_PYTHON).",
)
@click.option("--force", is_flag=True, help="Replace the folder if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines: the result's line only.")
def write(
    source: str,
    root: str,
    name: str | None,
    split: str | None,
    tasks_file: str | None,
    urls: tuple[str, ...],
    instances: str | None,
    mode: str,
    prompt_field: str | None,
    python: str | None,
    force: bool,
    quiet: bool,
) -> None:
    """Write ROOT/resources_servers/<name>/ for the agent environment at SOURCE.

    SOURCE is a bundle folder (gymhost's: env.py and tasks/<split>.jsonl; or agent-env's: tasks/<name>.json step
    lists, served by its OpenEnv app), the URL of a running OpenEnv server (its Task API gives the tasks), or the
    URL of a running agentenv environment (with --tasks FILE). What takes long (an OpenEnv server's tasks read a
    tenth at a time) is said on stderr as it goes, unless --quiet.
    """
    from ..environments import write_folder

    with one_line_errors(), _progress_lines(quiet):
        written = write_folder(
            source,
            root,
            name=name,
            split=split,
            tasks_file=tasks_file,
            urls=urls,
            instances=instances,
            mode=mode,
            prompt_field=prompt_field,
            python=python,
            force=force,
        )
    rows = ", ".join(f"data/{split_name}.jsonl: {count} rows" for split_name, count in written.rows.items())
    tools = ", ".join(tool["name"] for tool in written.source.tools)
    click.echo(f"gymhost: wrote {written.path} (environment {written.source.environment!r}; tools {tools}; {rows})")


@contextmanager
def _progress_lines(quiet: bool) -> Iterator[None]:
    """What the writing says of its progress (``gymhost.progress``) while it runs, nothing else the code it runs logs:
    on a terminal, a bar of the tasks read (each read is a DEBUG record with ``done`` and ``total``); otherwise its
    INFO lines, plain, on stderr."""
    if quiet:
        yield
        return
    writing = logging.getLogger("gymhost.progress")
    level = writing.level
    with contextlib.ExitStack() as shown:
        if redraws_in_place(sys.stderr):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            bar = shown.enter_context(Progress(*columns, transient=True, console=Console(stderr=True)))
            handler: logging.Handler = _Bar(bar)
            writing.setLevel(logging.DEBUG)
        else:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("gymhost: %(message)s"))
            writing.setLevel(logging.INFO)
        writing.addHandler(handler)
        try:
            yield
        finally:
            writing.removeHandler(handler)
            writing.setLevel(level)


class _Bar(logging.Handler):
    """Progress records as a rich bar: one task per thing ``counting`` names, moved to ``done`` of ``total``; a
    record without counts is printed above the bar."""

    def __init__(self, bar: Any) -> None:
        super().__init__()
        self.bar = bar
        self.tasks: dict[str, Any] = {}

    def emit(self, record: logging.LogRecord) -> None:
        what, done, total = (getattr(record, name, None) for name in ("counting", "done", "total"))
        if what is None or done is None or total is None:
            self.bar.console.print(f"gymhost: {record.getMessage()}", highlight=False, markup=False)
            return
        if what not in self.tasks:
            self.tasks[what] = self.bar.add_task(f"{what}: tasks read", total=total)
        self.bar.update(self.tasks[what], completed=done, total=total)
