"""The template's memory in huge pages before it forks, so that a fork and an instance's exit handle fewer
page-table entries.

Each instance is a fork of the template, and ends with its episode (``source.fresh_instances``). The kernel copies
the page tables of the template's anonymous memory at every fork and frees the instance's at every exit: one entry
for each 4 KiB page, some 12,000 for a template's 46 MB, much of a fork's and an exit's CPU. ``MADV_COLLAPSE``
(Linux 6.1) makes the memory already there 2 MiB pages, one entry each. A page an instance writes is still copied
4 KiB at a time: the kernel splits the instance's entry for that 2 MiB, not the template's.

Only dense memory is collapsed, a region whose pages are mostly resident (the interpreter's heap, its object
arenas), since a collapse fills the rest of each 2 MiB with pages of its own; and only a template of modest size
(``_AT_MOST``): the collapse copies what it makes huge, so the instances forked before it (the pool's first) stop
sharing it, one copy of the template's memory more until they end. Best effort: where huge pages are turned off
(the machine's setting ``never``, or the process's) or the kernel cannot, nothing changes but the cost.
"""

from __future__ import annotations

import ctypes
import errno

__all__ = ["collapse_into_huge_pages"]

_HUGE = 2 << 20  # x86-64's and arm64's (4 KiB granule) PMD-sized page
_MADV_COLLAPSE = 25
_DENSE = 0.9  # resident share of a region, at least, for it to be collapsed
_AT_MOST = 256 << 20  # dense memory a template may have collapsed: past it, the copy costs more than it saves
_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def collapse_into_huge_pages() -> int:
    """This process's dense anonymous memory collapsed into huge pages; the bytes asked for (0 where none was)."""
    try:
        with open(_SETTING) as setting:
            if "[never]" in setting.read():  # the machine's operator's choice, which MADV_COLLAPSE would override
                return 0
    except OSError:  # a kernel without them
        return 0
    spans = [span for start, end in _dense_regions() if (span := _aligned(start, end))[1] > span[0]]
    if sum(last - first for first, last in spans) > _AT_MOST:
        return 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    asked = 0
    for first, last in spans:
        if madvise(first, last - first, _MADV_COLLAPSE) != 0 and ctypes.get_errno() in (errno.ENOMEM, errno.EPERM):
            break  # no memory for it now, or huge pages forbidden to this process: the rest would fail alike
        asked += last - first  # (EINVAL, EAGAIN: a span of this region could not be, the others may)
    return asked


def _aligned(start: int, end: int) -> tuple[int, int]:
    return -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE


def _dense_regions() -> list[tuple[int, int]]:
    """The private, writable, anonymous mappings (and the ``[heap]``) mostly resident, from ``/proc/self/smaps``,
    read as bytes (a mapped file's name is any bytes but a newline)."""
    regions = []
    start = end = 0
    candidate = False
    try:
        with open("/proc/self/smaps", "rb") as smaps:
            for line in smaps:
                fields = line.split()
                if len(fields) >= 5 and b"-" in fields[0]:  # a mapping's header: range, permissions, offset, ...
                    permissions, named = fields[1], fields[5] if len(fields) > 5 else b""
                    candidate = permissions.startswith(b"rw") and permissions[3:4] == b"p" and named in (b"", b"[heap]")
                    low, _, high = fields[0].partition(b"-")
                    start, end = int(low, 16), int(high, 16)
                elif candidate and fields[:1] == [b"Rss:"] and int(fields[1]) * 1024 >= _DENSE * (end - start):
                    regions.append((start, end))
    except (OSError, ValueError, IndexError):  # not the file's usual form: nothing collapsed
        return []
    return regions
