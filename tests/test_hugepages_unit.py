"""The template's memory put in huge pages before it forks (``_hugepages``): where the kernel can, its dense memory
then sits in huge pages, unchanged, past whatever the kernel refuses (an idle thread's stack, a mapping that asks for
no huge pages); sparse memory is left sparse; and a child forked after it still writes to copies of its own. Run in a
process of its own: the huge pages are that process's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, mmap, os, threading, zlib
    from gymhost.environments._agentenv._hugepages import collapse

    def present_kb(mapping):
        # the pages of a mapping in memory, from /proc/self/pagemap
        start, pages = ctypes.addressof(ctypes.c_char.from_buffer(mapping)), len(mapping) // mmap.PAGESIZE
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            pagemap.seek(start // mmap.PAGESIZE * 8)
            entries = memoryview(pagemap.read(pages * 8)).cast("Q")
        return sum(1 for entry in entries if entry >> 63) * mmap.PAGESIZE // 1024

    def huge_kb(mapping=None):
        # AnonHugePages: the process's, or the mapping's own (its own flags keep it a mapping of its own)
        address = None if mapping is None else ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        total, inside = 0, address is None
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                first = line.split()[0]
                if "-" in first and not first.endswith(":"):
                    start, end = (int(part, 16) for part in first.split("-"))
                    inside = address is None or start <= address < end
                elif inside and first == "AnonHugePages:":
                    total += int(line.split()[1])
        return total

    held = [{"n": n, "name": f"object {n}"} for n in range(300_000)]  # tens of MB, as a template's imports
    # Below them in memory, so met first (maps are in address order, and new mappings go below old ones): what the
    # kernel refuses, which must not end the pass (a finished thread's stack, kept by the C library and mostly
    # untouched; a dense mapping that asks for no huge pages); and sparse memory, one page touched in each 2 MB.
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # what malloc and Python's allocator map
    refusing = mmap.mmap(-1, 8 << 20, flags=private)
    refusing.madvise(mmap.MADV_NOHUGEPAGE)
    refusing.write(b"x" * (8 << 20))
    sparse = mmap.mmap(-1, 16 << 20, flags=private)
    for offset in range(0, 16 << 20, 2 << 20):
        sparse[offset] = 1
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
        "sparse_kb": present_kb(sparse), "refusing_huge_kb": huge_kb(refusing),
        "unchanged": before == after == digest(), "child_sum": child_sum, "count": len(held),
    }))
    """
)

# Whether this kernel collapses a dense, aligned span at all (Linux 6.1 and later, with transparent huge pages).
PROBE = textwrap.dedent(
    """
    import ctypes, mmap
    from pathlib import Path
    size = int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    area = mmap.mmap(-1, 2 * size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = ctypes.addressof(ctypes.c_char.from_buffer(area))
    aligned = -(-start // size) * size
    area.write(b"x" * (2 * size))
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    print(madvise(aligned, size, 25) == 0)
    """
)


def _kernel_collapses() -> bool:
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    return probe.returncode == 0 and probe.stdout.strip() == "True"


def test_the_templates_dense_memory_goes_in_huge_pages_and_stays_its_own() -> None:
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(ran.stdout)
    assert seen["unchanged"], "the objects read the same after the collapse, and after a child wrote to its copies"
    assert seen["child_sum"] == -seen["count"], "the child wrote to copies of its own"
    assert seen["sparse_kb"] < 1024, f"sparse memory stays sparse: {seen}"
    assert seen["refusing_huge_kb"] == 0, f"a mapping that asks for no huge pages gets none: {seen}"
    if not _kernel_collapses():  # nothing done, and nothing else changes
        assert seen["collapsed"] == 0
        return
    # The objects' memory, made after what the kernel refuses: collapsed all the same.
    assert seen["collapsed"] >= 16 << 20, seen
    assert seen["huge_after"] >= seen["huge_before"] + 8 * 1024, seen  # KB: at least four huge pages more
