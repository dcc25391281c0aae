"""The one rule for every masked verdict gymhost serves: it never reaches a client as a score that client trains on.

A verdict is masked (``mask_sample: true``, with a ``failure_kind``) when the infrastructure or the environment lost
the episode: a written server's environment that failed, an instance that died, a session lost to a restart or
expired, a drain that timed out, a Gym 0.5+ server's own ``judge_failsafe``. How a client reads it decides what it
does with it, and the clients disagree (their code, read for this rule):

- verifiers (its NeMo Gym taskset, the client prime-rl trains through) returns ``float(reward)`` of any 2xx answer and
  never reads ``mask_sample``: a masked 200 is trained on as a 0.0. A non-2xx ``/verify`` raises inside its scoring,
  and the rollout is recorded as failed, which keeps it out of training.
- Gym 0.5+'s rollout collection reads ``mask_sample`` (the sample is kept, counted as masked, left out of the
  metrics), but a non-2xx ``/verify`` aborts the whole collection unless ``route_failures_to_sidecar`` is on. Gym
  0.4.0's reads neither, and aborts too.

No header, body field or path tells them apart reliably (Gym sends none that verifiers never does), so the choice is
a setting, ``masked_verdicts`` (``_config.MaskedVerdicts``): ``refuse`` (the default: safe for every client) answers a
masked verdict with an HTTP error naming the failure and carrying the verdict, counted in
``gymhost_masked_verdicts_refused_total``; ``answer`` lets the 200 through, for clients that read ``mask_sample``.
Servers answer every verdict as a 200; this layer, next to them, applies the rule. A written server run by Gym's own
launcher brings the rule with it (``launcher_mode``): there its only client is Gym's, of the same version.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._asgi import answer_json, path_below_mount
from .._config import MaskedVerdicts, resolve_masked_verdicts
from .._metrics import EpisodeMetrics
from .._nemo_gym import CANCELLED, PROVIDER_UNAVAILABLE, SESSION_EXPIRED, SESSION_LOST, SHUTDOWN

__all__ = ["VERDICT_FIELDS", "MaskedVerdictsMiddleware", "launcher_mode", "refusal", "refusal_status"]

# What a refusal carries of the verdict (its ``verdict``): the answer's own fields, not the request echoed back.
VERDICT_FIELDS = ("reward", "mask_sample", "failure_kind", "failure_reason", "criteria")
_MARK = b'"mask_sample"'
# The status says what was lost: the episode itself (410, as for a session whose owner is gone), the service for now
# (503, with Retry-After), or the environment or judge behind the server (502).
_GONE = frozenset({SESSION_LOST, SESSION_EXPIRED, CANCELLED})
_UNAVAILABLE = frozenset({PROVIDER_UNAVAILABLE, SHUTDOWN})


def refusal_status(failure_kind: str) -> int:
    if failure_kind in _GONE:
        return 410
    return 503 if failure_kind in _UNAVAILABLE else 502


def refusal(verdict: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and body a masked ``verdict`` is refused with."""
    kind = str(verdict.get("failure_kind") or "unknown")
    body = {
        "detail": f"no reward: the episode was masked ({kind}): {verdict.get('failure_reason')}",
        "failure_kind": kind,
        "verdict": {key: verdict[key] for key in VERDICT_FIELDS if key in verdict},
    }
    return refusal_status(kind), body


def launcher_mode() -> MaskedVerdicts:
    """The mode of a written server that Gym's own launcher runs (``GYMHOST_MASKED_VERDICTS`` when set): its client
    is Gym's, of the same nemo-gym, which reads ``mask_sample`` from 0.5 on and not before."""
    from .._nemo_gym import verdicts_carry_mask

    return resolve_masked_verdicts(None, default="answer" if verdicts_carry_mask() else "refuse")


class MaskedVerdictsMiddleware:
    """``masked_verdicts="refuse"``: a ``/verify`` answered 200 with ``mask_sample: true`` is answered with
    ``refusal`` instead. Only ``/verify`` answers are held back (each whole, to be read); an answer that does not
    mention ``mask_sample`` is not parsed."""

    def __init__(self, app: ASGIApp, *, metrics: EpisodeMetrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or path_below_mount(scope) != "/verify":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def hold(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] == 200:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            verdict = _masked(body)
            if verdict is None:
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
            status, refused = refusal(verdict)
            if self.metrics is not None:
                self.metrics.verdict_refused(refused["failure_kind"])
            headers = {"Retry-After": "1"} if status == 503 else None
            await answer_json(scope, receive, send, status, refused, headers)

        await self.app(scope, receive, hold)


def _masked(body: bytes) -> dict[str, Any] | None:
    """The verdict in ``body`` when it is a masked one."""
    if _MARK not in body:
        return None
    try:
        verdict = json.loads(body)
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) and verdict.get("mask_sample") is True else None
