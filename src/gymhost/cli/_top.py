"""``gymhost top``: a live view of running servers, from the ``/metrics`` and ``/readyz`` they already serve."""

from __future__ import annotations

import datetime
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator

import click

from .._config import TOKEN_ENV_VAR
from .._terminal import redraws_in_place
from .._watching import View

__all__ = ["top"]

_COLUMNS = ("server", "state", "open", "seeds/s", "calls/s", "p50", "p99", "masked", "pool", "waiting", "stops")


@click.command()
@click.argument("urls", nargs=-1, required=True, metavar="URL...")
@click.option("--token", help=f"The servers' bearer token. Default: ${TOKEN_ENV_VAR}, if set.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds a refresh.")
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many refreshes. Default: until Ctrl-C.")
def top(urls: tuple[str, ...], token: str | None, interval: float, count: int | None) -> None:
    """A live view of the servers at URL... (one server, or a replica set: each replica's address).

    Each refresh shows, per server: its state (ready, draining, not ready and why, or no answer), episodes open,
    seeds and tool calls a second, tool-call latency p50 and p99, verdicts masked (of all given, and by kind), the
    pool of environment instances by state, seeds waiting for one, and instances stopped by reason. Rates and
    latencies are over the last interval; the masked and stopped counts are since each server started. On a
    terminal the view is redrawn in place; otherwise it is one line per server a refresh (logfmt), for logs.
    """
    import httpx

    from .._watching import Reading, compare, read

    token = token if token is not None else os.environ.get(TOKEN_ENV_VAR) or None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    last: dict[str, Reading] = {}
    with httpx.Client(headers=headers, timeout=max(interval, 1.0)) as client:

        def refreshes() -> Iterator[list[list[str]]]:
            for number in range(count) if count else itertools.count():
                if number:
                    time.sleep(interval)
                readings = [read(client, url) for url in urls]
                client.cookies.clear()  # a balancer's affinity cookie would tie every reading to one replica
                rows = [_row(compare(last.get(reading.url), reading)) for reading in readings]
                last.update((reading.url, reading) for reading in readings)
                yield rows

        if _on_a_terminal():
            _live(refreshes())
            return
        try:
            for rows in refreshes():
                now = datetime.datetime.now().isoformat(timespec="seconds")
                for row in rows:
                    pairs = [f"{name}={_quoted(value)}" for name, value in zip(_COLUMNS, row, strict=True)]
                    click.echo(" ".join([now, *pairs]))
        except KeyboardInterrupt:  # how it is stopped, as on a terminal: not a failure
            pass


def _quoted(value: str) -> str:
    """A value as logfmt writes one: bare, or quoted when it holds a space."""
    return json.dumps(value) if " " in value or '"' in value else value


def _on_a_terminal() -> bool:
    return redraws_in_place(sys.stdout)


def _live(refreshes: Iterator[list[list[str]]]) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    def table(rows: list[list[str]]) -> Table:
        shown = Table(*_COLUMNS, title=f"gymhost top, {datetime.datetime.now():%H:%M:%S}", title_justify="left")
        for row in rows:
            shown.add_row(*row, style=None if row[1] == "ready" else "yellow")
        return shown

    try:
        with Live(console=Console(), auto_refresh=False) as live:
            for rows in refreshes:
                live.update(table(rows), refresh=True)
    except KeyboardInterrupt:
        pass


def _row(view: View) -> list[str]:
    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f}ms"

    def counts(values: dict[str, int]) -> str:
        return ",".join(f"{key}:{value}" for key, value in values.items() if value) or "-"

    if not view.answered:
        return [view.url, view.state, *("-" for _ in _COLUMNS[2:])]
    masked = sum(view.masked.values())
    return [
        view.url,
        view.state,
        str(view.episodes_open),
        rate(view.seeds_per_s),
        rate(view.calls_per_s),
        ms(view.call_p50_s),
        ms(view.call_p99_s),
        f"{masked}/{view.verdicts}" + (f" ({counts(view.masked)})" if masked else ""),
        counts(view.instances),
        str(view.seeds_waiting),
        counts(view.stops),
    ]
