"""The template's objects made immortal before it forks, so that its instances share their pages, not copy them.

A forked instance shares the template's memory until it writes to a page, and CPython writes to every object it
touches: its reference count. An instance's start and episode touch objects on about 2,000 of the template's pages,
each a page fault and a 4 KB copy, most of an instance's CPU (``benchmarks/README.md``, "What made it fast").
CPython 3.12 gave objects an immortal reference count (PEP 683): one at that value is never written again.
``immortalize`` sets it on every object the garbage collector tracks and on everything those refer to, through
the containers it does not track (a dict or a tuple of strings and numbers only), as Instagram's Cinder does before
its forks (``gc.immortalize_heap``); CPython has no public call for it (bpo-40255), so the count is written in place.

What that changes: those objects are never freed. The template keeps them for its whole life anyway; an instance
that drops one (the constructed environment's state it replaces) keeps it as shared memory, and its finalizer
(``__del__``, a weak reference's callback) does not run, as none runs at an instance's end either (it ends with
``os._exit`` or a kill). Code that reads reference counts (``sys.getrefcount``) sees a huge one. Objects made later,
by the template or an instance, are counted as before.

It writes only where the interpreter counts as it expects: CPython with the GIL, 64-bit, little-endian, 3.12 or
3.13 (the immortal value there is ``UINT32_MAX`` in the count's low half), and only if a probe object made immortal
this way then keeps its count as references to it come and go; and only in a process with one thread, since an
object another thread frees meanwhile would have its freed memory written.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import sysconfig
from typing import Any

__all__ = ["immortalize"]

_IMMORTAL = 0xFFFFFFFF  # _Py_IMMORTAL_REFCNT's low half, CPython 3.12 and 3.13, 64-bit
_ORDINARY = 0x7FFFFFFF  # a count at or above this is immortal already, or not an ordinary count
_SPAN = 1 << 47  # the user address space of a 64-bit Linux process (without 5-level page tables' opt-in)
_words: memoryview | None = None


def immortalize() -> int:
    """Make every object the collector tracks (unfrozen: ``gc.get_objects`` skips frozen ones), and what they refer
    to, immortal: how many were made so. 0 where the interpreter is not one this knows how to count for, or where
    another thread runs."""
    if not _known_interpreter() or _threads() != 1:
        return 0
    frontier = gc.get_objects()
    made = sum(map(_make_immortal, frontier))
    while frontier:  # what they refer to, and what that refers to where the collector does not track it
        found = gc.get_referents(*frontier)
        frontier = [value for value in found if _make_immortal(value) and not gc.is_tracked(value)]
        made += len(frontier)
    return made


def _make_immortal(value: Any) -> bool:
    """The object's reference count set to the immortal value, if it is an ordinary one: whether it was. The count
    itself marks an object seen, so nothing else is kept (a set of addresses left the template megabytes of
    fragmented memory, which every instance would inherit). One view of the whole address space, indexed in 4-byte
    words: a foreign call an object would cost ten times as much."""
    assert _words is not None
    address = id(value)
    low = address >> 2
    if address >= _SPAN or _words[low + 1] != 0 or _words[low] >= _ORDINARY:  # the high half, then the low
        return False
    _words[low] = _IMMORTAL
    return True


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # not known: not one


def _known_interpreter() -> bool:
    global _words
    if (
        sys.implementation.name != "cpython"
        or sys.version_info[:2] not in ((3, 12), (3, 13))
        or sys.maxsize != 2**63 - 1
        or sys.byteorder != "little"
        or sysconfig.get_config_var("Py_GIL_DISABLED")
    ):
        return False
    if _words is None:
        _words = memoryview((ctypes.c_char * _SPAN).from_address(0)).cast("B").cast("I")
    probe = [object()]
    _make_immortal(probe)
    counted = sys.getrefcount(probe)
    held = [probe, probe, probe]
    return sys.getrefcount(probe) == counted and len(held) == 3
