"""What a server remembers about sessions that ended, for a bounded time and in bounded number."""

from __future__ import annotations

import time
from collections import OrderedDict

__all__ = ["Memory"]

_REMEMBERED = 65536  # items kept at most, however recent


class Memory[V]:
    """Values by session id, each kept for ``ttl`` seconds and at most ``_REMEMBERED`` of them: what lets a late or
    repeated call get a meaningful answer, without growing with every episode the server ever played."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> V | None:
        item = self._items.get(key)
        return item[1] if item is not None else None

    def pop(self, key: str) -> V | None:
        item = self._items.pop(key, None)
        return item[1] if item is not None else None

    def put(self, key: str, value: V) -> None:
        self._items[key] = (time.monotonic() + self.ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > _REMEMBERED:
            self._items.popitem(last=False)

    def forget_before(self, now: float) -> None:
        """Drop what expired; insertion order is expiry order, so this stops at the first item still kept."""
        while self._items:
            key, (expires, _) = next(iter(self._items.items()))
            if expires > now:
                return
            del self._items[key]
