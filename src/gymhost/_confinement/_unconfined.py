"""The ``none`` level: hosted code runs as the server runs it, with what the server's user may reach (``--sandbox
off``, or ``auto`` where no namespaces are allowed). Its environment is still an allow-list, and gymhost's secrets
are still taken (``_environment``, ``_config.take_secrets``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ._base import Level
from ._limits import Limits
from ._rules import Rules

__all__ = ["Unconfined"]


class Unconfined:
    level: Level = "none"

    def __init__(self, description: str) -> None:
        self.description = description

    def command(
        self, argv: Sequence[str], *, readable: Sequence[Path], writable: Sequence[Path], network: bool = False
    ) -> list[str]:
        return list(argv)

    def environment(self) -> dict[str, str]:
        return {}

    def rules(self, *, hidden: Sequence[Path], limits: Limits, network: bool = False) -> Rules | None:
        return None  # no limits either: the code is trusted, or nothing here could hold it

    def hand_over(self, folder: Path) -> Path:
        return folder  # the server's own user, who may write there already
