"""Progress on long commands, in the terminal's habits: rich's progress bar on a terminal, a plain line per step
when the output is not one (CI, a pod's log), nothing with ``--quiet``. What went wrong is said as it happens, in
all three."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from .._terminal import redraws_in_place

__all__ = ["Progress", "progress"]


class Progress:
    """Steps of one long piece of work: ``total`` once known, then ``step`` for each one done."""

    def __init__(self, what: str, quiet: bool) -> None:
        self.what, self.quiet = what, quiet
        self.total: int | None = None
        self.done = self.failed = 0
        self.began = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def start(self, total: int) -> None:
        self.total, self.began = total, time.monotonic()
        if self._bar is not None:
            self._task = self._bar.add_task(self.what, total=total, failed="")

    def step(self, name: str, failure: str | None = None) -> None:
        self.done += 1
        self.failed += failure is not None
        if self.quiet:
            return
        if self._bar is not None:
            if failure is not None:
                self._bar.console.print(f"[red]FAIL[/red] {name}: {failure}", highlight=False, markup=True)
            failed = f"{self.failed} failed" if self.failed else ""
            self._bar.update(self._task, advance=1, failed=failed)
            return
        elapsed = time.monotonic() - self.began
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = ""
        if self.total and rate > 0:
            left = f", about {(self.total - self.done) / rate:.0f}s left"
        verdict = f"FAIL: {failure}" if failure is not None else "ok"
        click.echo(f"{self.what} {self.done}/{self.total or '?'} ({rate:.1f}/s{left}, {self.failed} failed): {name} "
                   f"{verdict}")  # fmt: skip


@contextmanager
def progress(what: str, *, quiet: bool = False) -> Iterator[Progress]:
    shown = Progress(what, quiet)
    if quiet or not redraws_in_place(sys.stdout):
        yield shown
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("[red]{task.fields[failed]}"))  # fmt: skip
    with Bar(*columns, transient=True) as bar:
        shown._bar = bar
        yield shown
