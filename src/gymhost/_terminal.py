"""Whether a stream is a terminal that output can be redrawn on in place (a progress bar, a status line, a live
table), as rich decides it: a terminal whose ``TERM`` is ``dumb`` or ``unknown`` is not one, and rich would draw
nothing there, so such output takes the plain lines a pipe gets."""

from __future__ import annotations

from typing import TextIO

__all__ = ["redraws_in_place"]


def redraws_in_place(stream: TextIO) -> bool:
    if not stream.isatty():  # the common case, without importing rich
        return False
    from rich.console import Console

    return Console(file=stream).is_interactive
