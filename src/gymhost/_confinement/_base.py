"""The one interface every confinement level implements (``Confinement``); the setting that chooses one is
``_config.Sandbox``.

A level is a backend: ``_bubblewrap`` (namespaces: the strongest this kernel offers without a VM), ``_landlock``
(where no namespaces may be made) and ``_unconfined`` (each instance within its limits, or the code trusted). The
launcher of hosted code asks its confinement for the command that starts a hosted process (``command``), for the
rules that process applies to itself once started (``rules``), and to hand over the one folder the process writes to
(``hand_over``): nothing else of a launcher knows which level runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal, Protocol

from .._config import STARTUP_PATH
from ._limits import Limits
from ._rules import Rules

__all__ = ["DEFAULT_SCRATCH_BYTES", "Confinement", "Level", "interpreter_paths"]

# What a level gives: ``namespaces`` (``_bubblewrap``); ``landlock`` (``_landlock``, where ``auto`` found no
# namespaces: each instance within its limits, its files and network restricted by Landlock and seccomp);
# ``limits`` (``_unconfined``, where neither may be had: each instance within its limits, and fresh for each
# episode, but with the server's reach);
# ``none`` (``_unconfined``, ``off``: the code trusted).
Level = Literal["namespaces", "landlock", "limits", "none"]

# Each instance's scratch (its /tmp and working directory): a tmpfs, so it counts as memory; big enough for a
# repository checkout or a compiled test binary, small enough that a pool of them fits in a machine's memory.
DEFAULT_SCRATCH_BYTES: Final = 512 * 1024 * 1024


class Confinement(Protocol):
    """How the processes of hosted code start and confine themselves, at one level."""

    level: Level
    # Why this level, in words for the start line ("bubblewrap 0.11.0 at /usr/bin/bwrap, as uid 65534").
    description: str

    def command(
        self,
        argv: Sequence[str],
        *,
        readable: Sequence[Path],
        writable: Sequence[Path],
        network: bool = False,
        workdir: Path | None = None,
        unreadable: Sequence[Path] = (),
    ) -> list[str]:
        """The command that runs ``argv`` as a process of hosted code, which may read ``readable`` (besides the
        interpreter, which it always may) and write ``writable`` (besides its own scratch), and reach the network
        only if ``network``; in ``workdir`` (readable too), else in its scratch. ``unreadable``: out of its sight
        even where the rest would show it (the served folder around a bundle, the bundle's tasks); a path named in
        ``readable`` below one of them stays readable, the deeper of the two deciding."""
        ...

    def environment(self) -> dict[str, str]:
        """What such a process's environment holds at this level, beside ``hosted_environment``'s allow-list."""
        ...

    def rules(
        self,
        *,
        hidden: Sequence[Path],
        limits: Limits,
        network: bool = False,
        readable: Sequence[Path] = (),
        unreadable: Sequence[Path] = (),
    ) -> Rules | None:
        """What the started process does to itself (``_rules``): ``hidden`` covered in each instance, ``limits``
        on each, the network theirs only if ``network``, ``readable`` (besides the interpreter) and ``unreadable``
        (as ``command`` takes them) where a level needs telling; None at a level that leaves it alone."""
        ...

    def hand_over(self, folder: Path) -> Path:
        """A folder in ``folder`` (the server's, private, removed with it) that the hosted processes may write to,
        and nobody else but the server: their sockets."""
        ...


def interpreter_paths() -> list[Path]:
    """What the server's Python needs to run as it runs here: its prefixes, and every folder on its path as it
    began (an editable install's source, ``PYTHONPATH``; not a served folder, put on it since)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    paths.update(entry for entry in STARTUP_PATH if os.path.isdir(entry))
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return [Path(path) for path in sorted(paths)]
