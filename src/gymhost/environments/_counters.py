"""Counters an operator reads on ``/agentenv/pool``, with a warning for the ones that mean trouble, at most once
every ``every_s`` seconds however often they happen (a full pool times out seeds by the hundred)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

__all__ = ["Counters"]


class Counters(dict[str, int]):
    def __init__(self, names: Iterable[str], logger: logging.Logger, every_s: float = 10.0) -> None:
        super().__init__(dict.fromkeys(names, 0))
        self._logger, self._every_s = logger, every_s
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def warn(self, name: str, message: str) -> None:
        """Count one, and log ``message`` unless the last warning of this counter was less than ``every_s`` ago."""
        self[name] += 1
        self._unlogged[name] = self._unlogged.get(name, 0) + 1
        now = time.monotonic()
        if now - self._logged_at.get(name, float("-inf")) >= self._every_s:
            self._logger.warning("%s (%d such since the last warning)", message, self._unlogged[name])
            self._logged_at[name], self._unlogged[name] = now, 0
