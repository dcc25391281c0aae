"""``gymhost check``: a written folder's rows played with their reference solutions and with empty attempts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ._common import one_line_errors
from ._progress import progress

if TYPE_CHECKING:
    from ..environments._writing._check import RowCheck

__all__ = ["check"]


@click.command()
@click.argument("folder", type=click.Path(path_type=str))
@click.option(
    "--solutions",
    "solutions_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Reference solutions for tasks that carry none: JSON Lines of {task_id, split?, tool_calls, final_text}.",
)
@click.option("--allow-unchecked", is_flag=True, help="Pass even when no row has a reference solution to check.")
@click.option("--quiet", "-q", is_flag=True, help="No progress: the report at the end only.")
def check(folder: str, solutions_file: Path | None, allow_unchecked: bool, quiet: bool) -> None:
    """Play every row of a written FOLDER with its reference solution and with an empty attempt.

    Shows its progress as rows end (rows done of all, their rate, the time left, failures named as they happen):
    a progress bar on a terminal, a line per row otherwise. Exits non-zero when a reference solution does not score
    1.0 or an empty attempt does, and when no row has a reference solution at all (then nothing but the empty
    attempts was checked), unless --allow-unchecked.
    """
    from .._nemo_gym import require_nemo_gym

    with one_line_errors():
        require_nemo_gym()
        from ..environments._writing._check import check_folder, format_report, load_solutions

        solutions = load_solutions(solutions_file) if solutions_file else None
        with progress("checked", quiet=quiet) as shown:

            def ended(row: RowCheck) -> None:
                shown.step(f"{row.split}:{row.task_id}", "; ".join(row.problems) or None)

            checks = check_folder(folder, solutions, started=shown.start, checked=ended)
    click.echo(format_report(checks))
    failed = [c for c in checks if c.problems]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(checks)} rows failed the check")
    checked = [c for c in checks if c.reference is not None]
    if not checked and not allow_unchecked:
        raise click.ClickException(
            f"none of the {len(checks)} rows has a reference solution: give them with --solutions FILE, or pass "
            "--allow-unchecked to accept a check of empty attempts only"
        )
    if len(checked) == len(checks):
        click.echo(f"all {len(checks)} rows pass: every reference solution scores 1.0 and no empty attempt does")
    else:
        click.echo(
            f"{len(checked)} of {len(checks)} rows checked against a reference solution, all pass; no empty attempt "
            "scores 1.0"
        )
