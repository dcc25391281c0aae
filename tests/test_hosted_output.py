"""What hosted code prints is logged as hosted code's, never as the server's (``gymhost._hosted_output``).

A written bundle's tool prints what would pass for the server's own lines: an episode's end with its reward as a JSON
record, the kind a run's pipeline counts (tests/test_operating.py counts them so), and a text line with a terminal
escape. Served with ``--log-format json``, on a real ``gymhost serve``: each is logged as a record of the
``gymhost.hosted`` logger, named by its folder, and the only episode ends are the server's. A tool that prints
faster than the server logs hosted lines is held back, and every line still arrives, in order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gymhost import EpisodeClient
from gymhost._hosted_output import LINES_PER_S, WAITING_MAX
from gymhost.environments import awrite_folder

from .agentenv_helpers import COUNTER_ENV, make_bundle, rows
from .processes import ServerProcess, gymhost_command, run_to_completion, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

FORGED = {"time": "2026-12-07T00:00:00.000+00:00", "level": "INFO", "logger": "gymhost.episodes",
          "event": "episode_end", "message": "episode ended", "outcome": "rewarded", "reward": 1.0}  # fmt: skip
FLOOD = LINES_PER_S * 5 // 2  # lines: more than two seconds' share, fewer than may wait (none dropped, however read)
assert FLOOD < WAITING_MAX

PRINTING_ENV = COUNTER_ENV.replace(
    """    @tool(name="stall")""",
    f'''    @tool(name="say")
    async def say(self) -> dict[str, Any]:
        """Print what would pass for the server's own lines."""
        import sys

        print({json.dumps(FORGED)!r}, file=sys.stderr, flush=True)
        print("an instance's line, in \\x1b[31mred", flush=True)
        return {{"count": self.count}}

    @tool(name="flood")
    async def flood(self) -> dict[str, Any]:
        """Print faster than the server logs hosted code's lines."""
        import sys

        for number in range({FLOOD}):
            print(f"flood line {{number}}", file=sys.stderr)
        sys.stderr.flush()
        return {{"count": self.count}}

    @tool(name="stall")''',
).replace("{TOOL}", "increment")


def records(server: ServerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.lines if line.startswith("{")]


async def test_what_hosted_code_prints_is_logged_as_its_own(tmp_path: Path) -> None:
    server, folder = await served_and_called(tmp_path, "/say", lambda found: len(hosted(found)) >= 3)
    name = folder.name
    assert [r["message"] for r in hosted(records(server))] == [
        f"{name}: counter env: loading",  # the bundle's import, in its template
        f"{name}: {json.dumps(FORGED)}",
        f"{name}: an instance's line, in \\x1b[31mred",  # escaped: no terminal escape reaches the log
    ]
    assert json.dumps(FORGED) not in server.lines, "a forged episode end"
    ends = [r for r in records(server) if r.get("event") == "episode_end"]  # the server's own: this one, as it stops
    assert [(r["logger"], r["outcome"]) for r in ends] == [("gymhost.episodes", "masked")], ends
    assert not [line for line in server.lines if "\x1b" in line or line.startswith("counter env")], server.output


async def test_hosted_code_that_prints_too_fast_is_held_back_and_nothing_is_lost(tmp_path: Path) -> None:
    last = f"flood line {FLOOD - 1}"
    server, _ = await served_and_called(tmp_path, "/flood", lambda found: any(last in r["message"] for r in found))
    found = hosted(records(server))
    flood = [r["message"].rsplit(" ", 1)[1] for r in found if "flood line" in r["message"]]
    assert flood == [str(number) for number in range(FLOOD)]
    held = [r for r in found if "held back" in r["message"]]
    assert held, "the flood was not held back"
    assert held[0]["level"] == "WARNING"


async def served_and_called(
    tmp_path: Path, tool: str, logged: Callable[[list[dict[str, Any]]], bool]
) -> tuple[ServerProcess, Path]:
    """The printing bundle served with JSON logs, one episode seeded and ``tool`` called; the server stopped once
    ``logged`` holds of its records (the relay logs as it reads, after the call's answer)."""
    bundle = make_bundle(tmp_path / "bundles")
    (bundle / "env.py").write_text(PRINTING_ENV)
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="process")).path
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--log-format", "json")) as server:
        async with EpisodeClient(server.url) as episode:
            await episode.seed(rows(folder)[0])
            answer = await episode.post(tool, {})
            assert answer.status_code == 200, answer.text
            wait_for(server, logged)
    return server, folder


def hosted(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in found if r["logger"] == "gymhost.hosted"]


async def test_a_template_that_fails_to_start_says_why_in_the_error(tmp_path: Path) -> None:
    """What it printed as it failed is in the server's error, read to its end first, whatever the log's level (here
    warning, which hides the hosted lines themselves)."""
    bundle = make_bundle(tmp_path / "bundles")
    broken = (
        "import os\n"
        'if os.path.exists(os.path.join(os.path.dirname(__file__), "broken")):\n'
        '    raise RuntimeError("broken at import")\n'
    )
    (bundle / "env.py").write_text(broken + PRINTING_ENV)
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="process")).path
    (folder / "bundle" / "broken").touch()  # written whole; broken once served
    command = gymhost_command("serve", str(folder), "--port", "0", "--log-level", "warning")
    done = run_to_completion(command, timeout=120)
    assert done.returncode != 0, done.stderr
    error = done.stderr[done.stderr.index("the instance template exited with status") :]
    assert "before serving; it said:\n" in error, done.stderr
    assert "importing it failed: RuntimeError('broken at import')" in error, done.stderr
    assert "gymhost.hosted" not in done.stderr, done.stderr


def wait_for(server: ServerProcess, done: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The server's JSON records once ``done(records)`` holds (the relay logs as it reads, after the call's answer)."""
    deadline = time.monotonic() + timeout
    while not done(found := records(server)):
        assert time.monotonic() < deadline, server.output
        time.sleep(0.05)
    return found
