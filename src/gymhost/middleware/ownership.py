"""Which episode requests this process serves: its own sessions; another's go to their owner, or are refused as
lost; and no new episodes while draining.

Every session and MCP token gymhost signs names the process that made it (``_process``: a replica id, a worker
index and this start of it). A request for a sibling worker's session, or for the session of another replica that
said where it listens, is forwarded there (``_forwarding``) and answered by its owner. One whose owner is gone
(restarted since, or unreachable, or a replica that never said where it is) reaches a process that never had the
episode; served, it would play or grade a session that process has never seen, and a Gym server's ``/verify``
would answer a genuine-looking ``reward: 0.0`` for an episode the infrastructure lost. Instead, following the
convention of Gym's own session routing (a session whose owner is gone is 410):

- ``/seed_session`` starts a new episode here, in a new session (a sibling worker's session still goes to it);
- ``/verify`` answers a masked verdict (``mask_sample: true``, ``failure_kind: session_lost``, the owner named in
  ``failure_reason``) where the nemo-gym version has those fields, and 410 naming the owner where it has not (0.4.0);
- any other POST of the session (a tool call, ``/close_session``, an MCP call with another process's token): 410,
  naming the owner.

While the process drains (``_process``), ``/seed_session`` answers 503 with ``Retry-After`` and ``failure_kind:
provider_unavailable``, so a load balancer or client takes the episode elsewhere; open episodes go on.

For a server that keeps its sessions in dicts of its own (any Gym server gymhost did not write), the middleware also
follows episodes from outside: a seed opens one, its ``/verify`` (whose verdict it reads) or ``/close_session`` ends
it, and one with no call for ``idle_s`` is forgotten. A Gymnasium-style server (nemo-gym 0.7.0's
``resources_servers/gymnasium``: no seed or verify, but ``/reset`` and ``/step``) is followed the same way: a reset
opens an episode (refused while draining, a new one here when the session is another process's), each step's reward
adds to it, and a step that answers ``terminated`` or ``truncated`` ends it, rewarded with the sum, as Gym's
gymnasium agent counts it (``/close`` ends one closed). That count is what a drain waits for, and it feeds the
episode metrics of such servers; a written server counts its own.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._forwarding import forward, may_forward, read_body
from .._mcp_tokens import TOKEN_HEADER, token_owner
from .._metrics import EpisodeMetrics
from .._process import process_state
from .sessions import OWNER_KEY, SESSION_ID_KEY

__all__ = ["SESSION_LOST", "SessionOwnershipMiddleware", "SessionTracker"]

SESSION_LOST = "session_lost"
_SESSION_FREE = frozenset({"/aggregate_metrics"})  # POST routes that need no session
_ANSWER_FIELDS = ("reward", "mask_sample", "failure_kind", "failure_reason")
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


class SessionOwnershipMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        server_key: str,
        masked_verdicts: bool,
        metrics: EpisodeMetrics,
        tracker: SessionTracker | None = None,
        gymnasium: bool = False,
    ) -> None:
        self.app = app
        self.server_key = server_key
        self.masked_verdicts = masked_verdicts
        self.metrics = metrics
        self.tracker = tracker
        # Where an episode starts, and the calls that may end it: Gym's seed and verify, or a Gymnasium-style reset
        # and steps.
        self.starts = frozenset({"/reset"} if gymnasium else {"/seed_session"})
        self.followed = self.starts | {"/verify", "/close_session"} | ({"/step", "/close"} if gymnasium else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = _below_mount(scope)
        if path in self.starts and process_state.draining:
            await _json(scope, receive, send, 503, _DRAINING, {"Retry-After": "5"})
            return
        token = next((value for name, value in scope["headers"] if name == TOKEN_HEADER.encode()), None)
        if token is not None:
            valid, owner = token_owner(self.server_key, token.decode("latin-1"))
            if valid and not process_state.is_mine(owner):
                if not await self._forwarded(scope, receive, send, owner):
                    await self._gone(scope, receive, send, owner)
                return
        session = scope.get("session")
        if session is not None and path not in _SESSION_FREE and not process_state.is_mine(session.get(OWNER_KEY)):
            owner = session.get(OWNER_KEY)
            if await self._forwarded(scope, receive, send, owner):
                return  # its owner answered (a repeated seed included: that is the owner's to judge)
            if path not in self.starts:
                await self._lost(scope, receive, send, path, owner)
                return
            if "gymhost.body" in scope:  # read for a forward that could not be made
                receive = _replay(scope.pop("gymhost.body"))
            session.clear()  # a new episode here, in a session of its own
            session[SESSION_ID_KEY] = str(uuid.uuid4())
            session[OWNER_KEY] = process_state.owner()
        if path in self.followed:
            await self._followed(scope, receive, send, path)
            return
        if self.tracker is not None and session is not None:
            self.tracker.touched(str(session.get(SESSION_ID_KEY)))
        await self.app(scope, receive, send)

    async def _forwarded(self, scope: Scope, receive: Receive, send: Send, owner: Any) -> bool:
        """Whether the owner, reached where it lives, answered the request. Its body is read either way: a lost
        session's verify is answered from it."""
        target = process_state.route(owner)
        if target is None or not may_forward(scope, target):
            return False
        body = await read_body(receive)
        if await forward(scope, _replay(body), send, target):
            return True
        scope["gymhost.body"] = body
        return False

    async def _lost(self, scope: Scope, receive: Receive, send: Send, path: str, owner: Any) -> None:
        if path != "/verify" or not self.masked_verdicts:
            await self._gone(scope, receive, send, owner)
            return
        body = scope.pop("gymhost.body", None)
        if body is None:
            body = await read_body(receive)
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        fields = {key: value for key, value in request.items() if key not in _ANSWER_FIELDS}
        reason = f"this session belongs to {process_state.describe(owner)}; its episode cannot be verified here"
        verdict = {**fields, "reward": 0.0, "mask_sample": True, "failure_kind": SESSION_LOST, "failure_reason": reason}
        self.metrics.ended("masked", SESSION_LOST)
        await _json(scope, receive, send, 200, verdict)

    async def _gone(self, scope: Scope, receive: Receive, send: Send, owner: Any) -> None:
        detail = f"this session belongs to {process_state.describe(owner)}; its episode is not here"
        await _json(scope, receive, send, 410, {"detail": detail, "failure_kind": SESSION_LOST, "owner": owner})

    async def _followed(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """Serve a seed, verify or close (or a reset or step), and note what it did to the session's episode."""
        status, chunks, size = 500, [], 0
        read_verdict = path in ("/verify", "/step") and self.tracker is not None

        async def watch(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif read_verdict and message["type"] == "http.response.body" and size <= _VERDICT_READ_LIMIT:
                chunk = message.get("body", b"")
                size += len(chunk)
                chunks.append(chunk)
            await send(message)

        await self.app(scope, receive, watch)
        if not 200 <= status < 300:
            return
        session = str((scope.get("session") or {}).get(SESSION_ID_KEY))
        if path in self.starts:
            self.metrics.session_started()
            if self.tracker is not None:
                self.tracker.seeded(session)
        elif path == "/step" and self.tracker is not None:
            self._stepped(session, b"".join(chunks) if size <= _VERDICT_READ_LIMIT else b"")
        elif self.tracker is not None and self.tracker.ended(session):
            if path in ("/close_session", "/close"):
                self.metrics.ended("closed")
            else:
                self._verdict(b"".join(chunks) if size <= _VERDICT_READ_LIMIT else b"")

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


_DRAINING = {
    "detail": "this server is draining (shutting down after its open episodes end): seed the episode elsewhere",
    "failure_kind": "provider_unavailable",
}


def _below_mount(scope: Scope) -> str:
    path: str = scope["path"]
    root = scope.get("root_path") or ""
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Any:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _json(
    scope: Scope, receive: Receive, send: Send, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    response: Response = JSONResponse(body, status_code=status, headers=headers)
    await response(scope, receive, send)
