"""The template's rehearsal (``_rehearsal``) plays gymhost's own environment through and leaves nothing a fork would
share: no descriptor, thread, file or socket, nothing reached outside the process. Run in a process of its own, as
in the template."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from gymhost.environments._agentenv import _rehearsal

    if sys.argv[1] == "uvloop":  # a bundle whose import made uvloop the loop of every asyncio.run
        import uvloop
        uvloop.install()

    reached = []
    def watch(event, arguments):
        path = str(arguments[0]) if arguments else ""
        if "__pycache__" in path or (sys.pycache_prefix and path.startswith(sys.pycache_prefix)):
            return  # bytecode an import writes is no reach of the rehearsal's
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT
        if event == "open" and isinstance(arguments[0], (str, bytes)) and (arguments[2] or 0) & writes:
            reached.append(f"open {arguments[0]!r} to write")
        elif event in ("socket.bind", "socket.connect", "socket.sendto", "socket.getaddrinfo") or event.startswith(
            ("subprocess.", "os.fork", "os.exec", "os.spawn", "os.posix_spawn", "os.mkdir", "os.remove", "tempfile.")
        ):  # an event loop's own socket pair, made and closed with it, is no reach outside
            reached.append(event)

    played = []
    original = _rehearsal._play
    async def counted():
        await original()
        played.append(True)
    _rehearsal._play = counted

    descriptors = os.listdir("/proc/self/fd")
    sys.addaudithook(watch)
    _rehearsal.rehearse()
    print(json.dumps({
        "played": len(played),
        "reached": reached,
        "new_descriptors": sorted(set(os.listdir("/proc/self/fd")) - set(descriptors)),
        "threads": len(os.listdir("/proc/self/task")),
    }))
    """
)


@pytest.mark.parametrize("loop_policy", ["default", "uvloop"])
def test_the_rehearsal_plays_and_leaves_nothing_a_fork_would_share(loop_policy: str) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT, loop_policy], capture_output=True, text=True, timeout=120, check=True
    )
    assert ran.stderr == ""  # no warning: every step answered as it should (a tool error raises)
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["played"] == 3
    assert seen["reached"] == []
    assert seen["new_descriptors"] == []
    assert seen["threads"] == 1
