"""The template's memory collapsed into huge pages (``_huge_pages``): a child forked after it maps that memory in
2 MiB pages, and a page it writes costs it 4 KiB, not 2 MiB; the parent's pages stay huge. Run in a process of its
own, as a template is one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import json, os, zlib
    from gymhost.environments._agentenv._huge_pages import collapse_into_huge_pages

    held = bytearray(os.urandom(32 << 20))  # a template's dense heap: 32 MiB, every page resident

    def huge_kb():
        with open("/proc/self/smaps_rollup") as rollup:
            return next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))

    def private_dirty_kb():
        with open("/proc/self/smaps_rollup") as rollup:
            return next(int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:"))

    huge_before = huge_kb()
    collapsed = collapse_into_huge_pages()
    checksum = zlib.crc32(held)
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:
        before = private_dirty_kb()
        for offset in range(0, len(held), 2 << 20):  # one byte in each 2 MiB
            held[offset] ^= 1
        os.write(writing, json.dumps(private_dirty_kb() - before).encode())
        os._exit(0)
    os.close(writing)
    child_copied_kb = json.loads(os.read(reading, 1000))
    os.waitpid(child, 0)
    print(json.dumps({"collapsed": collapsed, "huge_before": huge_before, "huge_kb": huge_kb(),
                      "child_copied_kb": child_copied_kb,
                      "intact": zlib.crc32(held) == checksum}))
    """
)


def test_a_child_maps_the_template_in_huge_pages_and_copies_what_it_writes_4_kib_at_a_time() -> None:
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(ran.stdout)
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[never]" in setting.read_text():  # none, or the operator's choice: nothing changes
        assert (seen["collapsed"], seen["huge_kb"]) == (0, 0)
        assert seen["intact"]
        return
    if "[madvise]" in setting.read_text():  # memory nobody asked huge pages for is in small ones until collapsed
        assert seen["huge_before"] < 4 << 10, seen
    assert seen["collapsed"] >= 28 << 20  # the 32 MiB less its unaligned ends
    assert seen["huge_kb"] >= 28 << 10  # and still huge in the parent after its child wrote to each
    # The child wrote one byte in each of 16 huge pages: 16 pages of 4 KiB copied (and a few of its own), not 32 MiB.
    assert seen["child_copied_kb"] < 1024, seen
    assert seen["intact"]  # what the child wrote is its own
