"""The template's memory in huge pages before it forks, so that a fork copies fewer page-table entries.

Each instance is a fork of the template, and the kernel's fork copies the page-table entry of every page of the
template's private memory (about 46 MB, 11,000 entries of 4 KB, for an agentenv bundle: mcp, pydantic and the
environment, imported once): most of what a cold batch's forks cost the template, which starts one instance an
episode (``perf``: ``copy_page_range``; ``benchmarks/README.md``, "The template's memory in huge pages"). A 2 MB
huge page is one entry, shared at the fork as a whole. ``collapse`` asks the kernel to back each 2 MB-aligned span
of the template's private anonymous memory with a huge page (``MADV_COLLAPSE``, Linux 6.1: synchronous, whatever the
system's ``transparent_hugepage`` setting, which is ``madvise`` on most distributions). Nothing an instance sees
changes: the same bytes, and a write to a shared huge page still copies 4 KB (the kernel splits the mapping of the
process that writes). The template's own writes after each fork split the spans they touch back into small pages,
so a part stays huge through a batch, and the saving is a part of the fork's cost.

Best effort: a kernel without it, a span it cannot collapse (memory too fragmented, a mapping it does not take) is
left as it was; the template then forks as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

__all__ = ["collapse"]

_MADV_COLLAPSE = 25
_HUGE = 2 << 20


def collapse() -> int:
    """Collapse the process's private anonymous memory into huge pages where the kernel can: the bytes it now covers
    (0 where it cannot at all)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    try:
        spans = _private_anonymous()
    except OSError:  # no /proc here
        return 0
    collapsed = 0
    for start, end in spans:
        low, high = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE
        if high <= low:
            continue
        if madvise(low, high - low, _MADV_COLLAPSE) == 0:
            collapsed += high - low
        elif ctypes.get_errno() == errno.EINVAL:  # a kernel before 6.1 (or without huge pages): none will
            return collapsed
    return collapsed


def _private_anonymous() -> list[tuple[int, int]]:
    """The spans of this process's private, writable anonymous memory (the heap and unnamed mappings): where
    Python's objects and the extensions' allocations are."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            permissions, name = fields[1], fields[5] if len(fields) > 5 else ""
            if permissions[:2] == "rw" and permissions[3] == "p" and name in ("", "[heap]"):
                start, _, end = fields[0].partition("-")
                spans.append((int(start, 16), int(end, 16)))
    return spans
