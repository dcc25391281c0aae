"""Episodes of an agent environment behind Gym's seed / tool / verify calls, independent of nemo-gym.

One ``Episode`` per Gym session: seeding leases an instance, resets it, loads the task's seed data and opens an MCP
session; tool calls go over that session; verifying grades and then tears the episode down (MCP session closed,
instance reset and released). The Gym server class only translates HTTP to these calls.

The line this module keeps: a sample is masked (``mask_sample``) only when the infrastructure failed, with a
``failure_kind`` from nemo-gym's shared vocabulary. A grader that ran and said 0 is a genuine 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from .._exceptions import GymhostError
from ._catalog import check_tasks, policy_tools
from ._env_client import (
    DataPlaneError,
    EnvClient,
    EnvDroppedError,
    EnvTimeoutError,
    EnvUnavailableError,
    MalformedReplyError,
    McpSession,
    McpSessionError,
)
from ._grading import CriterionResult, evaluate, extension_score, merge_state
from ._pool import Instance, Pool, PoolExhaustedError, StartupError
from ._tasks import ExtensionCriterion, StateCriterion, Task

__all__ = [
    "Episode",
    "EpisodeStateError",
    "Failure",
    "Reply",
    "Runtime",
    "RuntimeSettings",
    "SessionConflictError",
    "UnknownTaskError",
    "Verdict",
]

logger = logging.getLogger("gymhost.agentenv")

# failure_kind values: nemo-gym's shared vocabulary (nemo_gym.failure_kinds) where it has a name, else namespaced.
NO_INSTANCE = "provider_unavailable"
UNREACHABLE = "transport_unreachable"
PEER_DROP = "transport_peer_drop"
TIMEOUT = "transport_timeout"
SESSION_LOST = "session_lost"
SESSION_EXPIRED = "session_expired"
CANCELLED = "cancelled"
VERIFIER_ERROR = "verifier_error"
SHUTDOWN = "shutdown"
DATA_PLANE_ERROR = "agentenv:data_plane_error"
MALFORMED_REPLY = "agentenv:malformed_reply"
INTERNAL_ERROR = "agentenv:internal_error"
# Failures that say the instance itself is broken: it is replaced (a bundle) or probed (a URL) before reuse.
_BREAKS_INSTANCE = frozenset({UNREACHABLE, PEER_DROP, TIMEOUT, SESSION_LOST, MALFORMED_REPLY})

T = TypeVar("T")


_REMEMBERED = 65536  # closed session ids and verdicts kept at most, however recent


class UnknownTaskError(GymhostError, LookupError):
    """The row names a task this server does not have."""


class SessionConflictError(GymhostError):
    """The session is already seeded with another task or episode, or was closed."""


class EpisodeStateError(GymhostError):
    """A call the session's episode is not in a state for: verify without a seed, after a close, or a second time
    (then ``verdict`` is the first verdict, which is repeated for the caller)."""

    def __init__(self, message: str, verdict: Verdict | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict


@dataclass(frozen=True)
class Failure:
    kind: str
    reason: str


@dataclass(frozen=True)
class Reply:
    """A tool route's answer: the text the model sees, and the HTTP status that tells clients whether it failed.
    ``refused`` when gymhost refused the call (no episode, environment down) rather than the tool answering."""

    status: int
    text: str
    refused: bool = False


@dataclass(frozen=True)
class Verdict:
    task_id: str | None
    reward: float
    criteria: list[CriterionResult] = field(default_factory=list)
    failure: Failure | None = None

    @classmethod
    def masked(cls, task_id: str | None, failure: Failure) -> Verdict:
        return cls(task_id, 0.0, [], failure)


@dataclass(frozen=True)
class RuntimeSettings:
    environment: str
    role: str | None = None
    tool_timeout: float = 60.0
    idle_timeout: float = 300.0
    remember: float = 600.0  # how long closed session ids and verdicts are kept for late or repeated calls


@dataclass(eq=False)
class Episode:
    key: str
    split: str
    task: Task
    identity: Hashable | None = None
    instance: Instance | None = None
    tools: McpSession | None = None
    failure: Failure | None = None
    last_used: float = field(default_factory=time.monotonic)
    calls: int = 0  # tool calls in flight: an episode in use is never idle, however long a call takes
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Runtime:
    """Every state change of an episode (seed, verify, close, expiry) runs under the episode's lock and in a task of
    its own that the request only awaits: a client that disconnects mid-call (nemo-gym 0.5+ cancels the handler)
    leaves the episode seeded or failed, verified or not, never half of either, and its instance accounted for."""

    def __init__(self, pool: Pool, tasks: dict[str, list[Task]], settings: RuntimeSettings) -> None:
        self.pool = pool
        self.tasks = tasks
        self.settings = settings
        self.card: dict[str, Any] = {}
        self.tools: list[dict[str, Any]] = []
        self._episodes: dict[str, Episode] = {}
        self._closed = _Memory[None](settings.remember)
        self._verdicts = _Memory[Verdict](settings.remember)  # verdicts not yet answered: expired episodes
        self._answered = _Memory[Verdict](settings.remember)  # verdicts answered: a second verify is refused
        self._work: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self.counters = dict.fromkeys(("seeded", "seed_failed", "verified", "masked", "expired", "closed"), 0)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        card = await self.pool.start()
        try:
            if card["name"] != self.settings.environment:
                raise StartupError(
                    f"the environment is {card['name']!r}, but this server was written for "
                    f"{self.settings.environment!r}"
                )
            hidden = await self.pool.instances[0].client.hidden_tools(card)
            self.tools = policy_tools(card, hidden)
            check_tasks(
                {f"task split {split!r}": tasks for split, tasks in self.tasks.items()},
                card,
                [tool["name"] for tool in self.tools],
                hidden,
            )
        except BaseException:
            await self.pool.stop()
            raise
        self.card = card
        self._reaper = asyncio.create_task(self._reap_idle(), name="gymhost-episode-reaper")

    async def stop(self) -> None:
        """End every episode and stop the instances. By now the ASGI server has finished its requests; state
        changes still running belong to requests whose clients left, and are cut short."""
        self.pool.begin_stop()
        for task in [*self._work, *([self._reaper] if self._reaper else [])]:
            task.cancel()
        await asyncio.gather(*self._work, *([self._reaper] if self._reaper else []), return_exceptions=True)
        shutdown = Failure(SHUTDOWN, "the server shut down before the episode was verified")
        await asyncio.gather(
            *(self._end(episode, shutdown) for episode in list(self._episodes.values())), return_exceptions=True
        )
        await self.pool.stop()

    def status(self) -> dict[str, Any]:
        """What an operator watches: the pool's size and limits, its queue, and what happened to episodes."""
        pool = self.pool.status()
        return {
            "environment": self.card.get("name"),
            "limits": {
                "instances": self.pool.size,
                "lease_timeout_s": self.pool.lease_timeout,
                "tool_timeout_s": self.settings.tool_timeout,
                "data_timeout_s": self.pool.data_timeout,
                "startup_timeout_s": self.pool.startup_timeout,
                "idle_timeout_s": self.settings.idle_timeout,
                "remember_s": self.settings.remember,
            },
            "instances": pool["instances"],
            "free": pool["free"],
            "leased": pool["leased"],
            "resetting": pool["resetting"],
            "repairing": pool["repairing"],
            "waiting_seeds": pool["waiting_seeds"],
            "open_episodes": len(self._episodes),
            "remembered": {"verdicts": len(self._verdicts) + len(self._answered), "closed": len(self._closed)},
            "counters": {
                **self.counters,
                "lease_timeouts": pool["lease_timeouts"],
                "instances_replaced": pool["instances_replaced"],
            },
        }

    async def instance_status(self, index: int) -> dict[str, Any] | None:
        """One instance's status and its state as ``data/get`` answers it: how an operator (or a test) sees that a
        released instance was reset, in-process instances included. None for no such instance."""
        if not 0 <= index < len(self.pool.instances):
            return None
        instance = self.pool.instances[index]
        answer = instance.status()
        try:
            answer["data"] = merge_state(await instance.client.get())
        except (EnvUnavailableError, DataPlaneError) as error:
            answer["data"], answer["error"] = None, str(error)
        return answer

    # -- episodes -----------------------------------------------------------------------------------------------

    def find_task(self, split: str | None, task_id: str) -> tuple[str, Task]:
        splits = [split] if split else sorted(self.tasks)
        found = [(name, task) for name in splits for task in self.tasks.get(name, []) if task.id == task_id]
        if len(found) == 1:
            return found[0]
        if not found:
            where = f"split {split!r}" if split else f"splits {', '.join(sorted(self.tasks))}"
            raise UnknownTaskError(f"no task {task_id!r} in {where}")
        raise UnknownTaskError(f"task id {task_id!r} is in several splits; the row must name its split")

    async def seed(self, key: str, split: str | None, task_id: str, identity: Hashable | None = None) -> Episode:
        """Start the episode for session ``key``. Repeating a seed for the same task and identity is a no-op."""
        split, task = self.find_task(split, task_id)
        while (existing := self._episodes.get(key)) is not None:
            if existing.task is not task or existing.identity != identity:
                other = " and another episode" if existing.identity != identity else ""
                raise SessionConflictError(f"session {key} is already seeded with task {existing.task.id!r}{other}")
            async with existing.lock:  # a seed still in progress finishes first
                if self._episodes.get(key) is not existing:
                    continue  # it ended meanwhile; look again
                if existing.failure is None:
                    return existing
                await self._shielded(self._teardown(existing, None))  # that seed failed: this one tries again
        if key in self._closed:
            raise SessionConflictError(f"session {key} was closed; a new episode needs a new session")
        episode = Episode(key, split, task, identity)
        self._episodes[key] = episode
        self._verdicts.pop(key)
        self._answered.pop(key)
        return await self._shielded(self._seed(episode))

    async def call_tool(self, key: str, name: str, arguments: dict[str, Any]) -> Reply:
        episode = self._episodes.get(key)
        if episode is None:
            return Reply(409, f"{self._why_no_episode(key)}; a tool call needs a seeded episode", refused=True)
        episode.last_used = time.monotonic()
        if episode.failure is not None or episode.tools is None:
            reason = episode.failure.reason if episode.failure else "the episode is still being seeded"
            return Reply(503, f"the environment is unavailable: {reason}", refused=True)
        episode.calls += 1
        try:
            result = await episode.tools.call_tool(name, arguments)
        except Exception as error:
            episode.failure = _failure(error, stage=f"tool {name}")
            logger.warning("tool call %s failed: %s", name, episode.failure.reason)
            return Reply(503, f"the environment is unavailable: {episode.failure.reason}", refused=True)
        finally:
            episode.calls -= 1
            episode.last_used = time.monotonic()
        return Reply(400 if result.isError else 200, result.text)

    async def verify(self, key: str, final_text: str) -> Verdict:
        """Grade the episode, then tear it down. An episode that expired answers its masked verdict once; a verify
        with no episode to grade raises ``EpisodeStateError``."""
        episode = self._episodes.get(key)
        if episode is None:
            return self._verdict_after_the_fact(key)
        episode.last_used = time.monotonic()  # the sweeper must not take it while this verify waits to run
        return await self._shielded(self._verify(episode, final_text))

    async def close(self, key: str) -> None:
        """End the session's episode without grading it; later seeds on the same session are refused."""
        self._closed.put(key, None)
        episode = self._episodes.get(key)
        if episode is not None:
            self.counters["closed"] += 1
            await self._shielded(self._end(episode, None))

    # -- internals ----------------------------------------------------------------------------------------------

    async def _shielded(self, work: Coroutine[Any, Any, T]) -> T:
        task = asyncio.create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)
        return await asyncio.shield(task)

    async def _seed(self, episode: Episode) -> Episode:
        async with episode.lock:
            try:
                client = await self._lease_answering(episode)
                if episode.task.seed.parts:
                    parts = [part.model_dump(mode="json", exclude_none=True) for part in episode.task.seed.parts]
                    await client.add(parts)
                episode.tools = await client.tool_session(
                    self.card, role=self.settings.role, timeout=self.settings.tool_timeout
                ).open()
            except Exception as error:
                episode.failure = _failure(error, stage="seed")
                logger.warning("seeding task %r failed: %s", episode.task.id, episode.failure.reason)
                self.counters["seed_failed"] += 1
                await self._release(episode)
            else:
                self.counters["seeded"] += 1
            if episode.key in self._closed and episode.failure is None:  # closed while seeding: close tears it down
                # The instance is fine: "cancelled" is not a kind that sends it to repair.
                episode.failure = Failure(CANCELLED, "the session was closed while its episode was being seeded")
            episode.last_used = time.monotonic()
        return episode

    async def _lease_answering(self, episode: Episode) -> EnvClient:
        """Lease an instance and reset it. One that died while it was free does not answer: it goes to repair and
        the seed takes the next free one (or the repaired one), so a fault between episodes costs no episode."""
        for attempt in (1, 2):
            episode.instance = await self.pool.lease()
            try:
                await episode.instance.client.reset()
            except EnvUnavailableError as error:
                if attempt == 2:
                    raise
                logger.warning(
                    "environment instance %s did not answer: %s; seeding on another", episode.instance.index, error
                )
                instance, episode.instance = episode.instance, None
                await self.pool.release(instance, healthy=False)
                continue
            break
        assert episode.instance is not None
        return episode.instance.client

    async def _verify(self, episode: Episode, final_text: str) -> Verdict:
        async with episode.lock:
            if self._episodes.get(episode.key) is not episode:  # verified, closed or expired while we waited
                return self._verdict_after_the_fact(episode.key)
            if episode.failure is not None:
                verdict = Verdict.masked(episode.task.id, episode.failure)
            else:
                verdict = await self._grade(episode, final_text)
            self._answer(episode.key, verdict)
            await self._teardown(episode, verdict.failure)
        return verdict

    def _answer(self, key: str, verdict: Verdict) -> None:
        self._answered.put(key, verdict)
        self.counters["verified"] += 1
        self.counters["masked"] += verdict.failure is not None

    def _verdict_after_the_fact(self, key: str) -> Verdict:
        """A verify for a session with no episode: the masked verdict of one that expired (once), else refused."""
        pending = self._verdicts.pop(key)
        if pending is not None:
            self._answer(key, pending)
            return pending
        answered = self._answered.get(key)
        if answered is not None:
            raise EpisodeStateError("this episode was already verified; its verdict is repeated here", answered)
        raise EpisodeStateError(f"{self._why_no_episode(key)}; there is nothing to verify")

    def _why_no_episode(self, key: str) -> str:
        if key in self._verdicts:
            return "this session's episode expired (no call for idle_timeout_s); /verify answers its masked verdict"
        if key in self._answered:
            return "this session's episode was already verified and has ended"
        if key in self._closed:
            return "this session was closed"
        return "no episode for this session: call /seed_session first, and send the cookies it answers"

    async def _grade(self, episode: Episode, final_text: str) -> Verdict:
        assert episode.instance is not None
        client = episode.instance.client
        grading = episode.task.grading
        try:
            state = None
            if any(isinstance(criterion, StateCriterion) for criterion in grading.criteria):
                state = merge_state(await client.get())
            scores: dict[int, float] = {}
            for index, criterion in enumerate(grading.criteria):
                if isinstance(criterion, ExtensionCriterion):
                    answer = await client.call_extension(self.card, criterion.uri, criterion.method, criterion.params)
                    scores[index] = extension_score(criterion, answer)
        except Exception as error:
            episode.failure = _failure(error, stage="grading")
            return Verdict.masked(episode.task.id, episode.failure)
        outcome = evaluate(grading, state=state, extension_scores=scores, final_text=final_text)
        return Verdict(episode.task.id, outcome.reward, outcome.results)

    async def _end(self, episode: Episode, failure: Failure | None) -> None:
        async with episode.lock:
            await self._teardown(episode, failure)

    async def _teardown(self, episode: Episode, failure: Failure | None) -> None:
        """With the episode's lock held: forget it, close its MCP session, release its instance."""
        if self._episodes.get(episode.key) is episode:
            del self._episodes[episode.key]
        if failure is not None and episode.failure is None:
            episode.failure = failure
        if episode.tools is not None:
            tools, episode.tools = episode.tools, None
            with contextlib.suppress(Exception):
                await tools.close()
        await self._release(episode)

    async def _release(self, episode: Episode) -> None:
        instance, episode.instance = episode.instance, None
        if instance is None:
            return
        broken = episode.failure is not None and episode.failure.kind in _BREAKS_INSTANCE
        await self.pool.release(instance, healthy=not broken)

    async def _reap_idle(self) -> None:
        """The one sweeper: end episodes nobody touched for ``idle_timeout`` (a trainer that gave up mid-episode,
        and verifiers never calls /close_session, must not hold an instance forever; a late verify is answered
        ``session_expired``), and forget closed sessions and verdicts older than ``remember``."""
        interval = max(0.25, min(30.0, self.settings.idle_timeout / 4, self.settings.remember / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for memory in (self._closed, self._verdicts, self._answered):
                memory.forget_before(now)
            cutoff = now - self.settings.idle_timeout
            idle = [episode for episode in self._episodes.values() if self._idle(episode, cutoff)]
            # Together, so one instance slow to reset does not hold up the others; an error ends one expiry only.
            for outcome in await asyncio.gather(
                *(self._shielded(self._expire(episode, cutoff)) for episode in idle), return_exceptions=True
            ):
                if isinstance(outcome, Exception):
                    logger.error("ending an idle episode failed: %r", outcome, exc_info=outcome)

    @staticmethod
    def _idle(episode: Episode, cutoff: float) -> bool:
        return episode.last_used < cutoff and not episode.calls and not episode.lock.locked()

    async def _expire(self, episode: Episode, cutoff: float) -> None:
        """Decided again under the episode's lock: a verify or close that got there first wins."""
        async with episode.lock:
            if self._episodes.get(episode.key) is not episode or episode.last_used >= cutoff or episode.calls:
                return
            failure = Failure(SESSION_EXPIRED, f"no call for {self.settings.idle_timeout:g}s (idle_timeout_s)")
            self._verdicts.put(episode.key, Verdict.masked(episode.task.id, failure))
            self.counters["expired"] += 1
            await self._teardown(episode, failure)


class _Memory[V]:
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


def _failure(error: BaseException, *, stage: str) -> Failure:
    """Name an infrastructure failure in nemo-gym's vocabulary."""
    reason = f"{stage}: {error}"
    if isinstance(error, PoolExhaustedError):
        return Failure(NO_INSTANCE, reason)
    if isinstance(error, TimeoutError | httpx.TimeoutException | EnvTimeoutError):
        return Failure(TIMEOUT, reason)
    if isinstance(error, EnvDroppedError):
        return Failure(PEER_DROP, reason)
    if isinstance(error, EnvUnavailableError | httpx.TransportError):
        return Failure(UNREACHABLE, reason)
    if isinstance(error, MalformedReplyError):
        return Failure(MALFORMED_REPLY, reason)
    if isinstance(error, McpSessionError):
        return Failure(SESSION_LOST, reason)
    if isinstance(error, DataPlaneError):
        return Failure(DATA_PLANE_ERROR, reason)
    if stage == "grading":  # a grade extension that failed, or answered no score
        return Failure(VERIFIER_ERROR, reason)
    return Failure(INTERNAL_ERROR, f"{stage}: {error!r}")
