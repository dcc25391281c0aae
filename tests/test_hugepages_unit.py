"""The template's memory put in huge pages before it forks (``_hugepages``): where the kernel can, its objects then
sit in huge pages, unchanged, and a child forked after it still writes to copies of its own. Run in a process of its
own: the huge pages are that process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import json, os, zlib
    from gymhost.environments._agentenv._hugepages import collapse

    def huge_kb():
        with open("/proc/self/smaps_rollup") as rollup:
            return next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))

    held = [{"n": n, "name": f"object {n}"} for n in range(300_000)]  # tens of MB, as a template's imports
    digest = lambda: zlib.crc32(json.dumps(held).encode())
    before, huge_before = digest(), huge_kb()
    collapsed = collapse()
    after, huge_after = digest(), huge_kb()
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # writes everywhere in what it inherited, and reads it back
        for value in held:
            value["n"] = -1
        os.write(writing, json.dumps([sum(value["n"] for value in held)]).encode())
        os._exit(0)
    os.close(writing)
    (child_sum,) = json.loads(os.read(reading, 1000))
    os.waitpid(child, 0)
    print(json.dumps({
        "collapsed": collapsed, "huge_before": huge_before, "huge_after": huge_after,
        "unchanged": before == after == digest(), "child_sum": child_sum, "count": len(held),
    }))
    """
)


def _kernel_collapses() -> bool:
    """MADV_COLLAPSE: Linux 6.1 and later, with transparent huge pages built in."""
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 1) and Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()


def test_the_templates_memory_goes_in_huge_pages_and_stays_its_own() -> None:
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(ran.stdout)
    assert seen["unchanged"], "the objects read the same after the collapse, and after a child wrote to its copies"
    assert seen["child_sum"] == -seen["count"], "the child wrote to copies of its own"
    if not _kernel_collapses():  # nothing done, and nothing else changes
        assert seen["collapsed"] == 0
        return
    assert seen["collapsed"] >= 16 << 20, seen
    assert seen["huge_after"] >= seen["huge_before"] + 8 * 1024, seen  # KB: at least four huge pages more
