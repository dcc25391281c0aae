"""The template's memory in huge pages before it forks, so that a fork copies fewer page-table entries.

Each instance is a fork of the template, and the kernel's fork copies the page-table entry of every page of the
template's private memory (about 46 MB, near 12,000 entries of 4 KB, for an agentenv bundle: mcp, pydantic and the
environment, imported once): most of what a cold batch's forks cost the template, which starts one instance an
episode (``perf``: ``copy_page_range``; ``benchmarks/README.md``, "The template's memory in huge pages"). A huge
page (2 MB on x86-64) is one entry, shared at the fork as a whole. ``collapse`` asks the kernel to back the
template's private anonymous memory with huge pages (``MADV_COLLAPSE``, Linux 6.1: synchronous, whatever the
system's ``transparent_hugepage`` setting, which is ``madvise`` on most distributions), span by aligned span, and only
where a span is already nearly all in memory: a collapse fills the span, and a sparse one (an idle thread's stack,
an allocator's reserve) would grow the template by what it never used. The bytes stay the same, and an instance's
write to a page it shares with the template still copies that page alone (the kernel splits the writer's mapping,
building the small entries the fork skipped). The template's own writes after each fork split what they touch the
same way, so a part of the collapsed memory stays huge through a batch, and the saving is a part of a fork's cost.

Best effort: a kernel without it, a span it cannot collapse (marked ``MADV_NOHUGEPAGE``, not eligible) is skipped;
memory too short to find huge pages ends the pass; the template then forks as before.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
from pathlib import Path

__all__ = ["collapse"]

_MADV_COLLAPSE = 25
_DENSE = 7 / 8  # a span is collapsed when at least this share of its pages are in memory already (mincore)
_STOP = {errno.ENOMEM, errno.EBUSY}  # no huge page to be had now (memory, its cgroup's limit): the rest will not either


def collapse() -> int:
    """Collapse this process's private anonymous memory into huge pages where the kernel can and the memory is
    dense: the bytes of the spans the kernel collapsed (or found in a huge page already); 0 where it cannot."""
    size = _huge_page_size()
    if size is None:
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise, mincore = libc.madvise, libc.mincore
        regions = _private_anonymous()
    except (OSError, AttributeError):  # no libc symbol, no /proc
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    madvise.restype = mincore.restype = ctypes.c_int
    pages = size // mmap.PAGESIZE
    resident = ctypes.create_string_buffer(pages)
    collapsed = 0
    for start, end in regions:
        for low in range(-(-start // size) * size, end // size * size, size):
            if mincore(low, size, resident) != 0 or sum(byte & 1 for byte in resident.raw) < pages * _DENSE:
                continue  # sparse: collapsing it would fill it
            if madvise(low, size, _MADV_COLLAPSE) == 0:
                collapsed += size
            elif ctypes.get_errno() in _STOP:
                return collapsed
            # else EINVAL, EAGAIN: this span cannot be now (or the kernel has no MADV_COLLAPSE); the next may
    return collapsed


def _huge_page_size() -> int | None:
    """The size of the huge pages transparent huge pages use here (their PMD's: 2 MB on x86-64); None without them."""
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return None


def _private_anonymous() -> list[tuple[int, int]]:
    """This process's private, writable anonymous memory (the heap and unnamed mappings: Python's objects, the
    extensions' allocations), from ``/proc/self/maps``."""
    regions = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            permissions, name = fields[1], fields[5] if len(fields) > 5 else ""
            if permissions[:2] == "rw" and permissions[3] == "p" and name in ("", "[heap]"):
                start, _, end = fields[0].partition("-")
                regions.append((int(start, 16), int(end, 16)))
    return regions
