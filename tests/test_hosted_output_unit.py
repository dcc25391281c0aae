"""``gymhost._hosted_output`` on a real socket pair and a real event loop (asyncio's and uvloop): lines cut, every
character that could end a line or drive a terminal escaped, a flood of bytes pausing the reading, the last lines
kept for an error. tests/test_hosted_output.py has it in a real server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from gymhost._hosted_output import BYTES_PER_S, LINE_MAX, HostedOutput, pair, relay

pytestmark = pytest.mark.unit

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


async def relayed(*chunks: bytes, end: bool = True) -> tuple[HostedOutput, list[str]]:
    """``chunks`` sent one by one, then (``end``) the writer's end closed; what was logged, once all was read."""
    ours, theirs = pair()
    output = await relay(ours, "folder")
    for chunk in chunks:
        await asyncio.get_running_loop().sock_sendall(theirs, chunk)
    if end:
        theirs.close()
        await output.said(10)
    else:
        async with asyncio.timeout(30):  # a reading never paused fails here
            while output._transport is not None and output._transport.is_reading():  # read, then paused
                await asyncio.sleep(0.01)
        theirs.close()
    return output, list(output.tail)


@pytest.mark.parametrize("loop", LOOPS)
def test_lines_are_cut_and_escaped(loop: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gymhost.hosted")
    long = b"x" * (LINE_MAX + 100)
    tricky = "one\u2028two\x85three\x1b[31m\x9bfour\x0bfive\tsix".encode()
    _, said = LOOPS[loop](relayed(long + b"\n" + tricky + b"\r\n", b"no newline at the end"))
    assert said == [
        "x" * LINE_MAX + " [cut]",  # within one read
        "one\\u2028two\\x85three\\x1b[31m\\x9bfour\\x0bfive\tsix",
        "no newline at the end",
    ]
    assert [record.getMessage() for record in caplog.records] == [f"folder: {line}" for line in said]
    assert all(len(record.getMessage().splitlines()) == 1 for record in caplog.records)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_line_cut_across_reads_skips_its_rest(loop: str) -> None:
    _, said = LOOPS[loop](relayed(b"y" * (LINE_MAX + 1), b"y" * 100, b"y\nnext\n"))
    assert said == ["y" * LINE_MAX + " [cut]", "next"]


@pytest.mark.parametrize("loop", LOOPS)
def test_more_bytes_than_a_seconds_share_pause_the_reading(loop: str, caplog: pytest.LogCaptureFixture) -> None:
    """A read past the byte share, with no newline in it: reading pauses (to be paid back), and the log says so."""
    caplog.set_level(logging.INFO, logger="gymhost.hosted")
    LOOPS[loop](relayed(b"z" * (2 * BYTES_PER_S), end=False))
    assert any("held back" in record.getMessage() for record in caplog.records), caplog.text


@pytest.mark.parametrize("loop", LOOPS)
def test_the_last_lines_are_kept_for_an_error(loop: str) -> None:
    output, _ = LOOPS[loop](relayed(b"".join(b"line %d\n" % number for number in range(40))))
    assert output.last_lines() == "\n".join(f"line {number}" for number in range(25, 40))
    empty, _ = LOOPS[loop](relayed())
    assert empty.last_lines() == "it printed nothing"
