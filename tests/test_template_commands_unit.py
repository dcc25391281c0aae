"""How the instance template reads the server's commands (``_template._commands``): whole lines however the pipe
splits them, the last one at end of input, and its one idle step taken only once no command is waiting; and nothing
the environment's code starts reads them (a real template and its instances)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from gymhost.environments._agentenv._forking import BundleLauncher
from gymhost.environments._agentenv._template import _commands
from gymhost.environments._settings import PoolSettings

from .agentenv_helpers import make_bundle, until_described
from .processes import assert_none_naming

pytestmark = pytest.mark.unit

# At its import, the environment starts a process that reads its standard input to the end, as a shell would.
STDIN_READER = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()", "{MARK}"])
"""


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


@pytest.mark.anyio
async def test_a_process_the_environment_starts_reads_none_of_the_servers_commands(tmp_path: Path) -> None:
    """The template's standard input is the server's commands: a process the environment's code starts there would
    inherit it and read them (the server's spawns would go unanswered), and hold the channel open. It finds its
    standard input empty, and the template its commands, each instance answering."""
    mark = f"reads-its-stdin-{uuid4().hex}"
    bundle = make_bundle(tmp_path)
    env = bundle / "env.py"
    env.write_text(STDIN_READER.replace("{MARK}", mark) + env.read_text())
    launcher = BundleLauncher(bundle)
    try:
        instances = [await launcher.launch(index, PoolSettings()) for index in range(3)]
        for instance in instances:
            await until_described(instance)
        assert_none_naming(mark, "a process that reads its standard input to the end")  # its stdin was empty: it ended
        for instance in instances:
            await launcher.stop(instance)
    finally:
        await launcher.close()
