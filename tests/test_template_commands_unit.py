"""How the instance template reads the server's commands (``_template._commands``): whole lines however the pipe
splits them, the last one at end of input, and its one idle step taken only once no command is waiting."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from gymhost.environments._agentenv._template import _commands

pytestmark = pytest.mark.unit


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    reading, writing = os.pipe()
    yield reading, writing
    for end in (reading, writing):
        with contextlib.suppress(OSError):  # closed by the test already
            os.close(end)


def test_lines_come_whole_however_the_pipe_splits_them(pipe: tuple[int, int]) -> None:
    reading, writing = pipe
    lines = _commands(reading, idle=None)
    os.write(writing, b"spawn /a\nspa")
    assert next(lines) == "spawn /a"
    os.write(writing, b"wn /b\nspawn /c\n")
    assert next(lines) == "spawn /b"
    assert next(lines) == "spawn /c"
    os.write(writing, b"spawn /d")  # no newline: the server closed its end after it
    os.close(writing)
    assert list(lines) == ["spawn /d"]


def test_the_idle_step_runs_once_and_only_when_no_command_waits(pipe: tuple[int, int]) -> None:
    reading, writing = pipe
    seen: list[str] = []

    def idle() -> None:
        seen.append("idle")
        os.write(writing, b"spawn /c\n")  # a command that comes while the template is busy with it
        os.close(writing)

    os.write(writing, b"spawn /a\nspawn /b\n")
    seen.extend(_commands(reading, idle=idle))
    assert seen == ["spawn /a", "spawn /b", "idle", "spawn /c"]
