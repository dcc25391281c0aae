"""The template's memory in huge pages before it forks, so that a fork and an instance's exit handle a 512th of the
page-table entries.

Each instance is a fork of the template, and ends with its episode (``source.fresh_instances``). The kernel copies
the page tables of the template's anonymous memory at every fork and frees the instance's at every exit: one entry
for each 4 KiB page, some 15,000 for a template's 60 MB, most of a fork's and an exit's CPU. ``MADV_COLLAPSE``
(Linux 6.1) makes the memory already there 2 MiB pages, one entry each, whatever the machine's transparent huge
page setting short of ``never``. A page an instance writes is still copied 4 KiB at a time: the kernel splits the
instance's entry for that 2 MiB, not the template's.

Only dense memory is collapsed: a region whose pages are mostly resident (the interpreter's heap, its object
arenas), since a collapse fills the rest of each 2 MiB with pages of its own. Best effort: where the kernel cannot
(an older one, huge pages turned off, a container that forbids them), nothing changes but the cost.
"""

from __future__ import annotations

import ctypes
import errno

__all__ = ["collapse_into_huge_pages"]

_HUGE = 2 << 20  # x86-64's and arm64's (4 KiB granule) PMD-sized page
_MADV_COLLAPSE = 25
_DENSE = 0.9  # resident share of a region, at least, for it to be collapsed


def collapse_into_huge_pages() -> int:
    """This process's dense anonymous memory collapsed into huge pages; the bytes collapsed (0 where the kernel
    cannot)."""
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = 0
    for start, end in _dense_regions():
        first, last = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE
        if last <= first:
            continue
        if madvise(first, last - first, _MADV_COLLAPSE) == 0:
            collapsed += last - first
        elif ctypes.get_errno() in (errno.EINVAL, errno.EPERM):  # no such advice here, or huge pages forbidden
            return collapsed
    return collapsed


def _dense_regions() -> list[tuple[int, int]]:
    """The private, writable, anonymous mappings (and the ``[heap]``) mostly resident, from ``/proc/self/smaps``."""
    regions = []
    start = end = 0
    candidate = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if "-" in fields[0] and len(fields) >= 5:  # a mapping's header: range, permissions, offset, ...
                    span, permissions = fields[0], fields[1]
                    named = fields[5] if len(fields) > 5 else ""
                    candidate = permissions.startswith("rw") and permissions[3] == "p" and named in ("", "[heap]")
                    start, end = (int(bound, 16) for bound in span.split("-"))
                elif candidate and fields[0] == "Rss:" and int(fields[1]) * 1024 >= _DENSE * (end - start):
                    regions.append((start, end))
    except OSError:
        return []
    return regions
