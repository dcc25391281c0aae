"""Which episode requests this process serves: its own sessions; another's go to their owner, or are refused as lost.

Every session and MCP token gymhost signs names the process that made it (``_sessions._identity``: a replica id, a
worker index and this start of it). A request for a sibling worker's session, or for the session of another replica
that said where it listens, is forwarded there (``_sessions._forwarding``) and answered by its owner. One whose owner
is gone (restarted since, or unreachable, or a replica that never said where it is) reaches a process that never had
the episode; served, it would play or grade a session that process has never seen, and a Gym server's ``/verify``
would answer a genuine-looking ``reward: 0.0`` for an episode the infrastructure lost. Instead, following the
convention of Gym's own session routing (a session whose owner is gone is 410):

- a seed (``/seed_session``, or a Gymnasium-style ``/reset``) starts a new episode here, in a new session (a sibling
  worker's session still goes to it), unless the session says it played one (a written server's ``SEEDED_KEY``):
  that is 410, as below, since the model's own call could otherwise start its lost episode over;
- ``/verify`` answers a masked verdict (``mask_sample: true``, ``failure_kind: session_lost``, the owner named in
  ``failure_reason``), which ``masked_verdicts`` refuses (410) unless the app answers masked verdicts;
- any other POST of the session (a tool call, ``/close_session``, an MCP call with another process's token): 410,
  naming the owner.

A cookie or token gymhost stamped that does not verify here was signed with another secret (``_signing``: this
server before a restart that kept no secret, or a replica with another): its episode is lost the same way, never
played or graded here as a new one.

An owner that is alive but too busy to accept the forward (``_forwarding``'s ``BUSY``) still holds the episode:
that request is answered 503 with ``Retry-After``, and the episode goes on when the client retries.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Collection
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from .._asgi import answer_json, path_below_mount, read_body, replay
from .._keys import BODY, UNVERIFIED_OWNER
from .._metrics import EpisodeMetrics
from .._nemo_gym import SESSION_LOST
from ..middleware.masked_verdicts import VERDICT_FIELDS
from ._cookie import SEEDED_KEY, SESSION_ID_KEY
from ._forwarding import Forwarded, forward, may_forward
from ._identity import process_state
from ._owner import TOKEN_HEADER, owner_of, stamp
from ._signing import token_owner

__all__ = ["SessionOwnershipMiddleware"]

logger = logging.getLogger("gymhost")

_SESSION_FREE = frozenset({"/aggregate_metrics"})  # POST routes that need no session
_TOKEN_HEADER = TOKEN_HEADER.encode()
_ANOTHER_SECRET = ", signed with another secret than this process's"
_WHY = {"": "owner_gone", _ANOTHER_SECRET: "another_secret"}  # the metric's label


class SessionOwnershipMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        server_key: str,
        starts: Collection[str],
        metrics: EpisodeMetrics,
    ) -> None:
        self.app = app
        self.server_key = server_key
        self.starts = frozenset(starts)  # the POST paths that start an episode
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = path_below_mount(scope)
        token = next((value for name, value in scope["headers"] if name == _TOKEN_HEADER), None)
        if token is not None:
            valid, owner = token_owner(self.server_key, token.decode("latin-1"))
            if not valid and owner is not None and not process_state.is_mine(owner):
                await self._gone(scope, receive, send, owner, _ANOTHER_SECRET)
                return
            if valid and not process_state.is_mine(owner):
                outcome = await self._forward(scope, receive, send, owner)
                if outcome is Forwarded.BUSY:
                    await self._busy(scope, receive, send, owner)
                elif outcome is Forwarded.GONE:
                    await self._gone(scope, receive, send, owner)
                return
        unverified = UNVERIFIED_OWNER.get(scope)
        if unverified is not None and path not in _SESSION_FREE and path not in self.starts:
            await self._lost(scope, receive, send, path, unverified, _ANOTHER_SECRET)
            return  # (a seed starts a new episode here, in the new session the cookie layer gave it)
        session = scope.get("session")
        if session is not None and path not in _SESSION_FREE and not process_state.is_mine(owner_of(session)):
            owner = owner_of(session)
            outcome = await self._forward(scope, receive, send, owner)
            if outcome is Forwarded.ANSWERED:
                return  # its owner answered (a repeated seed included: that is the owner's to judge)
            if outcome is Forwarded.BUSY:  # alive, with the episode: not lost, and not to be started again here
                await self._busy(scope, receive, send, owner)
                return
            if path not in self.starts or session.get(SEEDED_KEY):  # a session that played is not started over
                await self._lost(scope, receive, send, path, owner)
                return
            body = BODY.pop(scope)
            if body is not None:  # read for a forward that could not be made
                receive = replay(body)
            session.clear()  # a new episode here, in a session of its own
            session[SESSION_ID_KEY] = str(uuid.uuid4())
            stamp(session, process_state.owner())
        await self.app(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, owner: Any) -> Forwarded:
        """The request sent to its owner where it lives (``GONE`` when it lives nowhere this process can reach). Its
        body is read either way: a lost session's verify is answered from it."""
        target = process_state.route(owner)
        if target is None or not may_forward(scope, target):
            return Forwarded.GONE
        body = await read_body(receive)
        outcome = await forward(scope, replay(body), send, target)
        if outcome is not Forwarded.ANSWERED:
            BODY.set(scope, body)
        return outcome

    async def _busy(self, scope: Scope, receive: Receive, send: Send, owner: Any) -> None:
        detail = f"this session belongs to {process_state.describe(owner)}, which is too busy to answer; retry"
        await answer_json(scope, receive, send, 503, {"detail": detail, "owner": owner}, {"Retry-After": "1"})

    async def _lost(self, scope: Scope, receive: Receive, send: Send, path: str, owner: Any, why: str = "") -> None:
        if path != "/verify":
            await self._gone(scope, receive, send, owner, why)
            return
        body = BODY.pop(scope)
        if body is None:
            body = await read_body(receive)
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        fields = {key: value for key, value in request.items() if key not in VERDICT_FIELDS}
        reason = f"this session belongs to {process_state.describe(owner)}{why}; its episode cannot be verified here"
        verdict = {**fields, "reward": 0.0, "mask_sample": True, "failure_kind": SESSION_LOST, "failure_reason": reason}
        self._count(scope, why, reason)
        self.metrics.ended("masked", SESSION_LOST)
        await answer_json(scope, receive, send, 200, verdict)

    async def _gone(self, scope: Scope, receive: Receive, send: Send, owner: Any, why: str = "") -> None:
        detail = f"this session belongs to {process_state.describe(owner)}{why}; its episode is not here"
        self._count(scope, why, detail)
        await answer_json(scope, receive, send, 410, {"detail": detail, "failure_kind": SESSION_LOST, "owner": owner})

    def _count(self, scope: Scope, why: str, said: str) -> None:
        """A lost episode's request leaves a log line and a metric, whatever the client does with its answer."""
        self.metrics.request_lost(_WHY[why])
        logger.warning("gymhost: POST %s answered as a lost session: %s", path_below_mount(scope), said)
