"""The ``limits`` and ``none`` levels: hosted code runs with what the server's user may reach, each instance within
its limits (``limits``: ``auto`` where neither namespaces nor Landlock may be had) or as the server runs it
(``none``: ``--sandbox off``). Its environment is still an allow-list, and gymhost's secrets are still taken
(``_environment``, ``_config.take_secrets``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ._base import DEFAULT_SCRATCH_BYTES, Level
from ._limits import Limits
from ._rules import Rules

__all__ = ["Unconfined"]


class Unconfined:
    def __init__(self, description: str, *, limited: bool) -> None:
        """``limited``: each instance still takes at most its limits (``auto`` where namespaces are refused), as
        its own fork sets them (``_rules.fork_instance``); else nothing is asked of it (``off``)."""
        self.description = description
        self.limited = limited
        self.level: Level = "limits" if limited else "none"

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
        return list(argv)

    def environment(self) -> dict[str, str]:
        return {}

    def rules(
        self,
        *,
        hidden: Sequence[Path],
        limits: Limits,
        network: bool = False,
        readable: Sequence[Path] = (),
        unreadable: Sequence[Path] = (),
    ) -> Rules | None:
        if not self.limited:
            return None
        limits = replace(limits, file_bytes=DEFAULT_SCRATCH_BYTES)  # a confined instance's scratch, as a file's bound
        return Rules(user=None, scratch_bytes=0, hidden=(), network=True, limits=limits, namespaces=False)

    def hand_over(self, folder: Path) -> Path:
        return folder  # the server's own user, who may write there already
