"""One episode as the runtime keeps it, and how its end is counted and logged.

An episode ends once, however it ends (verified, closed, expired, cut by a shutdown, or replaced by a second seed
after a failed one), and its end is counted in the metrics (``gymhost_episodes_ended_total``, ``gymhost_reward``) and
logged as one line of ``gymhost.episodes`` with its ids, outcome and durations: what a run is searched by.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from .._metrics import EpisodeMetrics
from ._backend import LeasedInstance, ToolSession
from ._outcomes import Failure, Verdict
from ._tasks import Task

__all__ = ["Episode", "Reply", "episode_ended", "log_fields"]

episode_log = logging.getLogger("gymhost.episodes")


@dataclass(frozen=True)
class Reply:
    """A tool route's answer: the text the model sees, and the HTTP status that tells clients whether it failed.
    ``refused`` when gymhost refused the call (no episode, environment down) rather than the tool answering."""

    status: int
    text: str
    refused: bool = False


@dataclass(eq=False)
class Episode:
    key: str
    split: str
    task: Task
    identity: Hashable | None = None
    instance: LeasedInstance | None = None
    tools: ToolSession | None = None
    failure: Failure | None = None
    started_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    tool_calls: int = 0  # tool calls made
    calls: int = 0  # tool calls in flight: an episode in use is never idle, however long a call takes
    no_calls: asyncio.Event = field(default_factory=asyncio.Event)  # set while ``calls`` is 0
    ending: bool = False  # being verified or torn down: no new tool call starts
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.no_calls.set()


def episode_ended(episode: Episode, verdict: Verdict | None, metrics: EpisodeMetrics) -> None:
    """Count and log the end of an episode, once: with the verdict it was given, masked with the failure that
    ended it, or closed."""
    failure = verdict.failure if verdict is not None else episode.failure
    outcome = "masked" if failure is not None else "rewarded" if verdict is not None else "closed"
    reward = verdict.reward if verdict is not None and failure is None else None
    metrics.ended(outcome, failure.kind if failure else None, reward)
    episode_log.info(
        "episode ended: session %s, task %s, %s%s after %.2fs, %d tool call(s)",
        episode.key,
        episode.task.id,
        outcome,
        f" {reward:g}" if reward is not None else f" ({failure.kind}: {failure.reason})" if failure else "",
        time.monotonic() - episode.started_at,
        episode.tool_calls,
        extra={
            "event": "episode_end",
            "session_id": episode.key,
            "task_id": episode.task.id,
            "outcome": outcome,
            "reward": reward,
            "failure_kind": failure.kind if failure else None,
            "failure_reason": failure.reason if failure else None,
            "duration_s": round(time.monotonic() - episode.started_at, 3),
            "tool_calls": episode.tool_calls,
        },
    )


def log_fields(episode: Episode) -> dict[str, Any]:
    """What a log line about an episode carries, so a run's logs can be searched by it (``--log-format json``)."""
    failure = episode.failure
    return {
        "session_id": episode.key,
        "task_id": episode.task.id,
        "failure_kind": failure.kind if failure else None,
    }
