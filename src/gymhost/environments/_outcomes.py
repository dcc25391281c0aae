"""How an episode ends: a verdict, or a failure named in nemo-gym's vocabulary.

The line this module keeps: a sample is masked (``mask_sample``) only when the infrastructure failed, with a
``failure_kind`` from nemo-gym's shared vocabulary (``nemo_gym.failure_kinds``) where it has a name, else one of
gymhost's own, namespaced ``agentenv:``. A grader that ran and said 0 is a genuine 0. ``classify`` names the failure
an error means; ``breaks_instance`` says whether it leaves the instance unfit for another episode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from .._confinement import LIMIT_KINDS
from .._nemo_gym import CANCELLED, PROVIDER_UNAVAILABLE, SESSION_EXPIRED, SESSION_LOST, SHUTDOWN
from ._errors import (
    DataPlaneError,
    EnvAtCapacityError,
    EnvDroppedError,
    EnvFailedError,
    EnvTimeoutError,
    EnvUnavailableError,
    InstanceLimitError,
    MalformedReplyError,
    McpSessionError,
    PoolExhaustedError,
)
from ._grading import CriterionResult

__all__ = [
    "CANCELLED",
    "DATA_PLANE_ERROR",
    "ENVIRONMENT_ERROR",
    "INTERNAL_ERROR",
    "KNOWN_KINDS",
    "MALFORMED_REPLY",
    "NO_INSTANCE",
    "NO_REWARD",
    "PEER_DROP",
    "SESSION_EXPIRED",
    "SESSION_LOST",
    "SHUTDOWN",
    "TIMEOUT",
    "UNREACHABLE",
    "VERIFIER_ERROR",
    "Failure",
    "Verdict",
    "breaks_instance",
    "classify",
]

NO_INSTANCE = PROVIDER_UNAVAILABLE
UNREACHABLE = "transport_unreachable"
PEER_DROP = "transport_peer_drop"
TIMEOUT = "transport_timeout"
VERIFIER_ERROR = "verifier_error"
DATA_PLANE_ERROR = "agentenv:data_plane_error"
MALFORMED_REPLY = "agentenv:malformed_reply"
INTERNAL_ERROR = "agentenv:internal_error"
# An OpenEnv environment's own failures: an episode it ended with an error (agent-env: a deploy, a verifier or a
# reward that failed), and one it ended without giving any reward. Neither says how the model did.
ENVIRONMENT_ERROR = "openenv:environment_error"
NO_REWARD = "openenv:no_reward"
# Every kind a failure may have: an instance's error naming another is malformed (a kind is a metric's label).
KNOWN_KINDS = frozenset(
    {
        NO_INSTANCE,
        UNREACHABLE,
        PEER_DROP,
        TIMEOUT,
        VERIFIER_ERROR,
        DATA_PLANE_ERROR,
        MALFORMED_REPLY,
        INTERNAL_ERROR,
        ENVIRONMENT_ERROR,
        NO_REWARD,
        CANCELLED,
        SESSION_EXPIRED,
        SESSION_LOST,
        SHUTDOWN,
        *LIMIT_KINDS.values(),
    }
)
# Failures that say the instance itself is broken: it is replaced (a bundle) or probed (a URL) before reuse.
_BREAKS_INSTANCE = frozenset({UNREACHABLE, PEER_DROP, TIMEOUT, SESSION_LOST, MALFORMED_REPLY, *LIMIT_KINDS.values()})


@dataclass(frozen=True)
class Failure:
    kind: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    task_id: str | None
    reward: float
    criteria: list[CriterionResult] = field(default_factory=list)
    failure: Failure | None = None

    @classmethod
    def masked(cls, task_id: str | None, failure: Failure) -> Verdict:
        return cls(task_id, 0.0, [], failure)


def breaks_instance(failure: Failure | None) -> bool:
    """Whether an episode that ended with ``failure`` leaves its instance unfit to serve another one."""
    return failure is not None and failure.kind in _BREAKS_INSTANCE


def sendable(text: str) -> str:
    """``text`` as UTF-8 can carry it to a client: a lone surrogate (a file name ``os.listdir`` could not decode, or
    hosted code's) as its escape, where it made the answer's encoding fail, a 500 in place of the tool's reply."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def sendable_json(value: Any) -> bytes:
    """``value`` as JSON a client can read, whatever hosted code put in it: a lone surrogate as its ``\\u`` escape,
    NaN and the infinities as null (as pydantic writes them), where Starlette's and FastAPI's encoders raise, a 500 in
    place of the answer. ``value`` came from JSON or from gymhost: only JSON's types."""
    written = json.dumps(value, ensure_ascii=True)  # NaN, Infinity and -Infinity as JavaScript's names
    if "NaN" in written or "Infinity" in written:  # somewhere: in a string, or as a number
        written = json.dumps(json.loads(written, parse_constant=lambda _: None), ensure_ascii=True, allow_nan=False)
    return written.encode("ascii")


def classify(error: BaseException, *, stage: str) -> Failure:
    """Name an infrastructure failure in nemo-gym's vocabulary; ``stage`` says what was being done."""
    reason = sendable(f"{stage}: {error}")
    if isinstance(error, PoolExhaustedError | EnvAtCapacityError):
        return Failure(NO_INSTANCE, reason)
    if isinstance(error, TimeoutError | httpx.TimeoutException | EnvTimeoutError):
        return Failure(TIMEOUT, reason)
    if isinstance(error, InstanceLimitError):  # before EnvDroppedError: an instance that said why it ended
        return Failure(error.kind, reason)
    if isinstance(error, EnvDroppedError):
        return Failure(PEER_DROP, reason)
    if isinstance(error, EnvUnavailableError | httpx.TransportError):
        return Failure(UNREACHABLE, reason)
    if isinstance(error, EnvFailedError):
        return Failure(error.kind or ENVIRONMENT_ERROR, reason)
    if isinstance(error, MalformedReplyError):  # before McpSessionError: an MCP reply that is not MCP is this one
        return Failure(MALFORMED_REPLY, reason)
    if isinstance(error, McpSessionError):
        return Failure(SESSION_LOST, reason)
    if isinstance(error, DataPlaneError):
        return Failure(DATA_PLANE_ERROR, reason)
    if stage == "grading":  # a grade extension that failed, or answered no score
        return Failure(VERIFIER_ERROR, reason)
    return Failure(INTERNAL_ERROR, f"{stage}: {error!r}")
