"""Following the episodes of a server from outside: for the open-episode count a drain waits for and for the episode
metrics, of servers that keep their sessions in dicts of their own (any Gym server gymhost did not write; a written
one counts its own, and only its seeds are counted here).

A seed opens an episode, its ``/verify`` (whose verdict is read) or ``/close_session`` ends it, and one with no call
for ``idle_s`` is forgotten. A Gymnasium-style server (nemo-gym 0.7.0's ``resources_servers/gymnasium``: no seed or
verify, but ``/reset`` and ``/step``) is followed the same way: a reset opens an episode, each step's reward adds to
it, and a step that answers ``terminated`` or ``truncated`` ends it, rewarded with the sum, as Gym's gymnasium agent
counts it (``/close`` ends one closed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._asgi import path_below_mount
from .._metrics import EpisodeMetrics
from .._sessions._cookie import SESSION_ID_KEY

__all__ = ["EpisodeTrackingMiddleware", "SessionTracker"]

_VERDICT_READ_LIMIT = 8 * 1024 * 1024  # a verify answer larger than this (a huge transcript echoed) is not parsed


class SessionTracker:
    """Sessions seeded here and not yet seen verified or closed, each forgotten after ``idle_s`` without a call, with
    the rewards their steps gave (a Gymnasium-style server's)."""

    def __init__(self, idle_s: float = 300.0) -> None:
        self.idle_s = idle_s
        self._open: dict[str, float] = {}
        self._rewards: dict[str, float] = {}

    def seeded(self, session: str) -> None:
        self._open[session] = time.monotonic()
        self._rewards.pop(session, None)

    def touched(self, session: str) -> None:
        if session in self._open:
            self._open[session] = time.monotonic()

    def rewarded(self, session: str, reward: float) -> None:
        if session in self._open:
            self._rewards[session] = self._rewards.get(session, 0.0) + reward

    def reward_of(self, session: str) -> float:
        return self._rewards.get(session, 0.0)

    def ended(self, session: str) -> bool:
        self._rewards.pop(session, None)
        return self._open.pop(session, None) is not None

    def open_count(self) -> int:
        cutoff = time.monotonic() - self.idle_s
        for session in [key for key, seen in self._open.items() if seen < cutoff]:
            del self._open[session]
            self._rewards.pop(session, None)
        return len(self._open)


class EpisodeTrackingMiddleware:
    """``tracker`` None: a server that counts its own episodes; only its seeds are counted here."""

    def __init__(
        self, app: ASGIApp, *, starts: Collection[str], metrics: EpisodeMetrics, tracker: SessionTracker | None
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.tracker = tracker
        # Where an episode starts, and the calls that may end it: Gym's seed and verify, or a Gymnasium-style reset
        # and steps.
        self.starts = frozenset(starts)
        gymnasium = "/reset" in self.starts
        self.followed = self.starts | {"/verify", "/close_session"} | ({"/step", "/close"} if gymnasium else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = path_below_mount(scope)
        if path in self.followed:
            await self._followed(scope, receive, send, path)
            return
        session = scope.get("session")
        if self.tracker is not None and session is not None:
            self.tracker.touched(str(session.get(SESSION_ID_KEY)))
        await self.app(scope, receive, send)

    async def _followed(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """Serve a seed, verify or close (or a reset or step), and note what it did to the session's episode."""
        status, chunks, size = 500, [], 0
        read_answer = path in ("/verify", "/step") and self.tracker is not None

        async def watch(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif read_answer and message["type"] == "http.response.body" and size <= _VERDICT_READ_LIMIT:
                chunk = message.get("body", b"")
                size += len(chunk)
                chunks.append(chunk)
            await send(message)

        await self.app(scope, receive, watch)
        if not 200 <= status < 300:
            return
        session = str((scope.get("session") or {}).get(SESSION_ID_KEY))
        answer = b"".join(chunks) if size <= _VERDICT_READ_LIMIT else b""
        if path in self.starts:
            self.metrics.session_started()
            if self.tracker is not None:
                self.tracker.seeded(session)
        elif path == "/step" and self.tracker is not None:
            self._stepped(session, answer)
        elif self.tracker is not None and self.tracker.ended(session):
            if path in ("/close_session", "/close"):
                self.metrics.ended("closed")
            else:
                self._verdict(answer)

    def _stepped(self, session: str, body: bytes) -> None:
        """A Gymnasium-style step: its reward adds to the episode's, and one that terminates or truncates ends it."""
        assert self.tracker is not None
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.tracker.touched(session)
            return
        reward = answer.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            self.tracker.rewarded(session, float(reward))
        if answer.get("terminated") or answer.get("truncated"):
            total = self.tracker.reward_of(session)
            if self.tracker.ended(session):
                self.metrics.ended("rewarded", reward=total)
        else:
            self.tracker.touched(session)

    def _verdict(self, body: bytes) -> None:
        try:
            verdict = json.loads(body)
        except ValueError:
            verdict = None
        if not isinstance(verdict, dict):
            self.metrics.ended("rewarded")
        elif verdict.get("mask_sample"):
            self.metrics.ended("masked", str(verdict.get("failure_kind") or "unknown"))
        else:
            reward = verdict.get("reward")
            self.metrics.ended("rewarded", reward=float(reward) if isinstance(reward, int | float) else None)
