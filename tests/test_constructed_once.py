"""Process instances forked from one environment the template constructed: a copy each, nothing shared.

The template constructs the environment once and forks every instance from it, where the constructor allows it
(it starts no thread and leaves no file or socket open); otherwise, or when the folder says
``source.construct_once: false``, each instance constructs its own after its fork, as before. Real template and
instance processes, reached over their channels as a process-mode server reaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gymhost._confinement import confinement
from gymhost.environments._agentenv._forking import BundleLauncher
from gymhost.environments._backend import Catalog, Instance
from gymhost.environments._pool import Pool
from gymhost.environments._settings import PoolSettings

from .agentenv_helpers import until_described
from .processes import STATE_TIMEOUT_S, alive, children, command_line, descendants

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

# Processes are named as the sandbox's /proc names them (the pid of a confined instance's own PID namespace is 1 in
# each), and each construction by a token of its own (a template started again may get its predecessor's number).
NOTES_ENV = """
import _thread
import os
import socket
import tempfile
import threading
import time
import uuid
from typing import Any

from agentenv_protocol import AgentEnvEnvironment, environment_card, reset_data, tool


def this_process() -> int:
    return int(os.readlink("/proc/self"))


@environment_card(name="notes")
class NotesEnv(AgentEnvEnvironment):
    def __init__(self) -> None:
        self.construction = uuid.uuid4().hex
        self.constructed_in = this_process()
        self.notes: list[str] = []
        self.shared = {"notes": self.notes}  # nested state: a copy per instance too
        self.drawn = None  # drawn by the reset, as the docs tell an environment constructed once to do
        self.resets = 0
        CONSTRUCTOR_EXTRA

    @reset_data
    async def reset(self) -> None:
        self.notes.clear()
        self.drawn = uuid.uuid4().hex
        self.resets += 1

    @tool(name="note")
    async def note(self, text: str) -> dict[str, Any]:
        \"\"\"Keep a note; answer every note kept, and where the environment was made and runs.\"\"\"
        self.notes.append(text)
        return {
            "notes": self.shared["notes"],
            "construction": self.construction,
            "constructed_in": self.constructed_in,
            "serving_in": this_process(),
            "drawn": self.drawn,
            "resets": self.resets,
        }
"""

# What a constructor may do that a fork cannot carry over: then each instance constructs its own.
UNFORKABLE = {
    "socket": ("self.socket = socket.socket()", "leaves a file or socket open"),
    "thread": ("threading.Thread(target=threading.Event().wait, daemon=True).start()", "starts a thread"),
    # A thread threading does not count, as native code starts them: the kernel counts it.
    "native thread": ("_thread.start_new_thread(time.sleep, (60,))", "starts a thread"),
    # A directory made and kept by path, with no descriptor left open: every instance would share it.
    "directory": ("self.workdir = tempfile.mkdtemp()", "reaches outside its process: it calls tempfile.mkdtemp"),
    "file": ("open(os.path.join(tempfile.gettempdir(), f'notes-{os.getpid()}'), 'w').close()", "reaches outside"),
}


@asynccontextmanager
async def launched(
    tmp_path: Path, count: int, *, extra: str = "pass", construct_once: bool = True
) -> AsyncIterator[tuple[BundleLauncher, list[Instance]]]:
    bundle = tmp_path / "notes"
    bundle.mkdir()
    (bundle / "env.py").write_text(NOTES_ENV.replace("CONSTRUCTOR_EXTRA", extra))
    launcher = BundleLauncher(bundle, construct_once=construct_once)
    instances = []
    try:
        for index in range(count):
            instance = await launcher.launch(index, PoolSettings())
            instances.append(instance)
            await until_described(instance)
        yield launcher, instances
    finally:
        for instance in instances:
            await launcher.stop(instance)
        await launcher.close()


async def note(instance: Instance, text: str) -> dict[str, Any]:
    session = await instance.client.tool_session(Catalog("notes"), role=None, timeout=30).open()
    try:
        result = await session.call_tool("note", {"text": text})
    finally:
        await session.close()
    assert not result.isError, result.text
    answer: dict[str, Any] = json.loads(result.text)
    return answer


def template_pid(launcher: BundleLauncher) -> int:
    """The process the launcher started for its template (confined, the sandbox's, which the template dies with)."""
    assert launcher._template is not None
    return launcher._template.process.pid


def constructed_once_in_the_template(one: dict[str, Any], two: dict[str, Any]) -> None:
    """Constructed once, in a process that serves neither (the template), and forked: each instance serves in a
    process of its own."""
    assert one["construction"] == two["construction"]
    assert one["constructed_in"] == two["constructed_in"]
    assert len({one["serving_in"], two["serving_in"], one["constructed_in"]}) == 3


async def test_instances_forked_from_one_constructed_environment_share_no_state(tmp_path: Path) -> None:
    async with launched(tmp_path, 2) as (_, (first, second)):
        one = await note(first, "a")
        two = await note(second, "b")
        again = await note(first, "c")
    assert one["notes"] == ["a"]
    assert two["notes"] == ["b"], "a note kept by one instance reached another"
    assert again["notes"] == ["a", "c"]
    constructed_once_in_the_template(one, two)


async def test_each_instance_is_reset_before_its_first_episode_and_draws_its_own(tmp_path: Path) -> None:
    """The environment's reset runs in each instance before its first episode, as before every other: what an
    environment constructed once draws per instance, it draws there."""
    bundle = tmp_path / "notes"
    bundle.mkdir()
    (bundle / "env.py").write_text(NOTES_ENV.replace("CONSTRUCTOR_EXTRA", "pass"))
    pool = Pool(BundleLauncher(bundle), 2, 2, PoolSettings())
    await pool.start()
    try:
        first, second = await pool.lease(), await pool.lease()
        one, two = await note(first, "a"), await note(second, "b")
    finally:
        await pool.stop()
    # Once as it started; the instance whose tool sessions the pool opened to read its hidden tools, once more.
    assert sorted((one["resets"], two["resets"])) == [1, 2], "an instance began its episode unreset, or reset twice"
    assert one["drawn"] != two["drawn"]


async def test_a_template_that_died_is_started_again_for_the_next_instance(tmp_path: Path) -> None:
    async with launched(tmp_path, 1) as (launcher, (first,)):
        before = (await note(first, "before"))["construction"]
        os.kill(template_pid(launcher), signal.SIGKILL)
        await asyncio.wait_for(launcher.exited(first), STATE_TIMEOUT_S)  # it dies with its template
        second = await launcher.launch(1, PoolSettings())
        try:
            await until_described(second)
            answer = await note(second, "a")
        finally:
            await launcher.stop(second)
    assert answer["notes"] == ["a"]
    assert answer["construction"] != before, "not forked from a new template"
    assert answer["constructed_in"] != answer["serving_in"]


async def test_a_constructor_that_only_reads_files_is_constructed_once(tmp_path: Path) -> None:
    extra = "self.source = open(__file__).read()"  # read, and closed: nothing outside the process changes
    async with launched(tmp_path, 2, extra=extra) as (_, (first, second)):
        one, two = await note(first, "a"), await note(second, "b")
    constructed_once_in_the_template(one, two)


async def test_construct_once_false_constructs_in_each_instance(tmp_path: Path) -> None:
    async with launched(tmp_path, 2, construct_once=False) as (_, (first, second)):
        one, two = await note(first, "a"), await note(second, "b")
    assert one["constructed_in"] == one["serving_in"]
    assert two["constructed_in"] == two["serving_in"]
    assert (one["notes"], two["notes"]) == (["a"], ["b"])


@pytest.mark.parametrize("kind", UNFORKABLE)
async def test_a_constructor_a_fork_cannot_copy_runs_in_each_instance(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    extra, why = UNFORKABLE[kind]
    caplog.set_level(logging.INFO, logger="gymhost.hosted")  # what the template says, logged as its output
    async with launched(tmp_path, 2, extra=extra) as (_, (first, second)):
        one, two = await note(first, "a"), await note(second, "b")
    assert one["constructed_in"] == one["serving_in"]
    assert two["constructed_in"] == two["serving_in"]
    assert (one["notes"], two["notes"]) == (["a"], ["b"])
    said = "NotesEnv: each instance constructs its own environment: its constructor "
    assert said + why in caplog.text


TICKING_ENV = """
import os
import threading
import time
from typing import Any

from agentenv_protocol import AgentEnvEnvironment, environment_card, tool

TICKS = [0]


def tick() -> None:
    while True:
        TICKS[0] += 1
        time.sleep(0.01)


threading.Thread(target=tick, daemon=True).start()  # at import, which a fork would not carry over
with open(os.path.join(os.path.dirname(__file__), "imports"), "a") as imports:
    imports.write(f"{os.getpid()}\\n")


@environment_card(name="ticking")
class TickingEnv(AgentEnvEnvironment):
    @tool(name="ticks")
    async def ticks(self) -> dict[str, Any]:
        \"\"\"How often the import's thread has ticked.\"\"\"
        return {"ticks": TICKS[0]}
"""


async def ticks(instance: Instance) -> int:
    session = await instance.client.tool_session(Catalog("ticking"), role=None, timeout=30).open()
    try:
        answer: int = json.loads((await session.call_tool("ticks", {})).text)["ticks"]
    finally:
        await session.close()
    return answer


async def test_an_import_that_starts_a_thread_is_imported_once_an_instance(tmp_path: Path) -> None:
    """A fork carries no thread over, so instances of an environment whose import started one are started as
    processes of their own, thread and all; the template, which found that out and exited, is not started again for
    each of them."""
    bundle = tmp_path / "ticking"
    bundle.mkdir()
    (bundle / "env.py").write_text(TICKING_ENV)
    # Unconfined: each import writes to the bundle's folder, where the test counts them (a confined one cannot:
    # tests/test_confinement.py serves such an environment confined).
    launcher = BundleLauncher(bundle, confinement=confinement("off"))
    instances = []
    try:
        for index in range(3):
            instances.append(await launcher.launch(index, PoolSettings()))
            await until_described(instances[-1])
            assert launcher._template is not None
            await launcher._template.process.wait()  # it said it cannot fork, and exited
        for instance in instances:
            first, deadline = await ticks(instance), time.monotonic() + 30
            while await ticks(instance) == first:
                assert time.monotonic() < deadline, "the import's thread does not run in the instance"
                await asyncio.sleep(0.05)
    finally:
        for instance in instances:
            await launcher.stop(instance)
        await launcher.close()
    imports = (bundle / "imports").read_text().split()
    assert len(imports) == 4, f"imported {len(imports)} times for 3 instances (the template's import and theirs)"
    assert len(set(imports)) == 4


HANGING_SERVER = """
import asyncio
import sys
from pathlib import Path

from gymhost._confinement import confinement
from gymhost.environments._agentenv._forking import BundleLauncher
from gymhost.environments._settings import PoolSettings

asyncio.run(BundleLauncher(Path(sys.argv[1])).launch(0, PoolSettings()))
"""


def test_a_template_stuck_in_a_constructor_dies_with_the_server(tmp_path: Path) -> None:
    """The server is killed while the template constructs an environment that never finishes: the template,
    which reads no command meanwhile, and the throwaway child it constructs in, go with it."""
    bundle = tmp_path / "notes"
    bundle.mkdir()
    (bundle / "env.py").write_text(NOTES_ENV.replace("CONSTRUCTOR_EXTRA", "time.sleep(3600)"))
    server = subprocess.Popen([sys.executable, "-c", HANGING_SERVER, str(bundle)])
    templates: list[int] = []
    constructing: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not constructing:  # the template, and under it the throwaway child running the constructor
            assert server.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the template never started constructing"
            templates = descendants(server.pid)  # the template, and the sandbox's processes above it (confined)
            constructing = [
                child for template in templates if "_template" in command_line(template) for child in children(template)
            ]
            time.sleep(0.05)
        server.kill()
        server.wait()
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while any(alive(pid) for pid in [*templates, *constructing]) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in [*templates, *constructing] if alive(pid)]
        assert not left, f"{left} outlived the server that started them"
    finally:
        server.kill()
        server.wait()
        for pid in [*templates, *constructing]:  # nothing left behind when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
