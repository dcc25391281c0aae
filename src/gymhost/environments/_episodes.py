"""The episode state machine: Gym's seed / tool / verify / close calls on an environment, independent of nemo-gym
and of HTTP.

One ``Episode`` per Gym session: seeding leases an instance from the pool (on a clean slate), begins the
task on it and opens its tool session; tool calls go over that session; verifying grades and then tears the episode
down (tool session closed, instance given back); a close, an idle timeout or the server's shutdown tear it down
without grading. The pool owns the instances (``InstancePool``; ``_pool.Pool`` in a server, a fake in the unit
tests): ``Episodes`` only says how an episode ended, and the pool decides what that means for its instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Hashable
from typing import Any, TypeVar

from .._metrics import EpisodeMetrics
from ._backend import INSTANCE_STATES, Catalog, InstancePool
from ._catalog import TaskRule, check_tasks, server_tools
from ._episode import Episode, Reply, episode_ended, log_fields
from ._errors import EpisodeStateError, MalformedReplyError, SessionConflictError, StartupError, UnknownTaskError
from ._grading import Asked, Observation
from ._memory import Memory
from ._outcomes import (
    CANCELLED,
    MALFORMED_REPLY,
    SESSION_EXPIRED,
    SHUTDOWN,
    TIMEOUT,
    Failure,
    Verdict,
    breaks_instance,
    classify,
)
from ._settings import EpisodeSettings
from ._tasks import Task

__all__ = ["Episode", "Episodes", "Reply"]

logger = logging.getLogger("gymhost.environments")

T = TypeVar("T")

_SETTLE_MARGIN_S = 1.0  # past a call's own limit (which ends it), how long an ending episode waits for it
_SEED_ATTEMPTS = 3  # instances a seed tries when the ones it was given die while it is seeded


class Episodes:
    """Every episode of a server. Each state change of an episode (seed, verify, close, expiry) runs under the
    episode's lock and in a task of its own that the request only awaits: a client that disconnects mid-call
    (nemo-gym 0.5+ cancels the handler) leaves the episode seeded or failed, verified or not, never half of either,
    and its instance accounted for."""

    def __init__(
        self,
        pool: InstancePool,
        tasks: dict[str, list[Task]],
        environment: str,
        settings: EpisodeSettings,
        rule: TaskRule,
        metrics: EpisodeMetrics | None = None,
    ) -> None:
        self.pool = pool
        self.rule = rule  # the protocol's task rules (its backend's ``check_task``)
        self.metrics = metrics if metrics is not None else EpisodeMetrics()
        self.tasks = tasks
        self.environment = environment
        self.settings = settings
        self.tools: list[dict[str, Any]] = []
        self._episodes: dict[str, Episode] = {}
        self._closed = Memory[None](settings.remember_s)
        self._verdicts = Memory[Verdict](settings.remember_s)  # verdicts not yet answered: expired episodes
        self._answered = Memory[Verdict](settings.remember_s)  # verdicts answered: a second verify is refused
        self._work: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._stopping = False
        self.counters = dict.fromkeys(
            ("seeded", "seed_failed", "seeds_moved", "verified", "masked", "expired", "closed"), 0
        )

    @property
    def catalog(self) -> Catalog:
        return self.pool.catalog

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.pool.start()
        try:
            catalog = self.pool.catalog
            if catalog.name != self.environment:
                raise StartupError(
                    f"the environment is {catalog.name!r}, but this server was written for {self.environment!r}"
                )
            self.tools = server_tools(catalog, (task for tasks in self.tasks.values() for task in tasks))
            check_tasks({f"task split {split!r}": tasks for split, tasks in self.tasks.items()}, catalog, self.rule)
        except BaseException:
            await self.pool.stop()
            raise
        self._reaper = asyncio.create_task(self._reap_idle(), name="gymhost-episode-reaper")

    async def stop(self) -> None:
        """End every episode and stop the instances. By now the ASGI server has finished its requests; state
        changes still running belong to requests whose clients left, and are cut short."""
        self._stopping = True
        self.pool.begin_stop()
        background = [*self._work, *([self._reaper] if self._reaper else [])]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        shutdown = Failure(SHUTDOWN, "the server shut down before the episode was verified")
        await asyncio.gather(
            *(self._end(episode, shutdown) for episode in list(self._episodes.values())), return_exceptions=True
        )
        await self.pool.stop()

    def open_episodes(self) -> int:
        return len(self._episodes)

    def gauges(self) -> dict[str, Any]:
        """The pool's and the episodes' gauges, for the metrics."""
        pool = self.pool.status()
        return {
            "open_episodes": len(self._episodes),
            "instances": {state: pool.get(state, 0) for state in INSTANCE_STATES},
            "waiting": pool.get("waiting_seeds", 0),
            "confinement": pool.get("confinement"),
        }

    def status(self) -> dict[str, Any]:
        """What an operator watches: the pool's size and limits, its queue, and what happened to episodes."""
        pool = self.pool.status()
        return {
            "environment": self.catalog.name,
            "limits": {
                **pool["limits"],
                "tool_timeout_s": self.settings.tool_timeout_s,
                "idle_timeout_s": self.settings.idle_timeout_s,
                "remember_s": self.settings.remember_s,
            },
            **{key: value for key, value in pool.items() if key not in ("limits", "counters")},
            "open_episodes": len(self._episodes),
            "remembered": {"verdicts": len(self._verdicts) + len(self._answered), "closed": len(self._closed)},
            "counters": {**self.counters, **pool["counters"]},
        }

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

    async def seed(
        self, key: str, split: str | None, task_id: str, identity: Hashable | None = None, *, again: bool = False
    ) -> Episode:
        """Start the episode for session ``key``. Repeating a seed for the same task and identity is a no-op.
        ``again``: the session itself says it was seeded before (its signed cookie), so nothing but that repeat, or
        the retry of a seed that failed (while its masked verdict is remembered), may follow."""
        split, task = self.find_task(split, task_id)
        while (existing := self._episodes.get(key)) is not None:
            if existing.task is not task or existing.identity != identity:
                other = " and another episode" if existing.identity != identity else ""
                raise SessionConflictError(f"session {key} is already seeded with task {existing.task.id!r}{other}")
            async with existing.lock:  # a seed still in progress finishes first
                if self._episodes.get(key) is not existing:
                    continue  # it ended meanwhile (a failed seed ends at once, its verdict kept); look again
                if existing.failure is None:
                    return existing
                # It failed in play (a tool call, its instance): its verify answers it masked; never started over.
                raise SessionConflictError(
                    f"session {key}'s episode failed ({existing.failure.kind}); a new episode needs a new session"
                )
        # A session plays one episode: once closed, verified or expired, a seed on it would start the episode over
        # and drop its verdict. Through Gym's agents, which POST any function call the model makes to /<its name>,
        # the model could verify mid-episode (its answer graded, the expected values shown), or idle past
        # idle_timeout_s, then seed again on the same cookie, with the task of its choice, and replay what it learned
        # for the trainer's verify. Only a seed that failed may be tried again, for its own task, while its masked
        # verdict waits unanswered (the 503 Retry-After contract).
        pending = self._verdicts.get(key)
        spent = "was closed" if key in self._closed else "was verified" if key in self._answered else None
        if spent is None and pending is not None and pending.failure is not None:
            if pending.failure.kind == SESSION_EXPIRED:
                spent = "expired"
            elif pending.task_id != task.id:
                spent = f"failed to seed task {pending.task_id!r}, the only task it may seed again"
        if spent is None and again and pending is None:
            spent = "has played an episode"
        if spent is not None:
            raise SessionConflictError(f"session {key} {spent}; a new episode needs a new session")
        episode = Episode(key, split, task, identity)
        self._episodes[key] = episode
        self._verdicts.pop(key)
        return await self._shielded(self._seed(episode))

    def holds(self, key: str) -> bool:
        """Whether a close of session ``key`` would end something: an episode, or a masked verdict waiting."""
        return key in self._episodes or key in self._verdicts

    async def call_tool(self, key: str, name: str, arguments: dict[str, Any]) -> Reply:
        episode = self._episodes.get(key)
        if episode is None:
            pending = self._verdicts.get(key)
            if pending is not None and pending.failure is not None and pending.failure.kind != SESSION_EXPIRED:
                return Reply(503, f"the environment is unavailable: {pending.failure.reason}", refused=True)
            return Reply(409, f"{self._why_no_episode(key)}; a tool call needs a seeded episode", refused=True)
        episode.last_used = time.monotonic()
        if episode.ending:
            return Reply(409, "this session's episode is being verified or closed; no more tool calls", refused=True)
        if episode.failure is not None or episode.tools is None:
            reason = episode.failure.reason if episode.failure else "the episode is still being seeded"
            return Reply(503, f"the environment is unavailable: {reason}", refused=True)
        episode.calls += 1
        episode.tool_calls += 1
        episode.no_calls.clear()
        began = time.perf_counter()
        try:
            result = await episode.tools.call_tool(name, arguments)
        except Exception as error:
            if episode.failure is None:
                episode.failure = classify(error, stage=f"tool {name}")
            logger.warning("tool call %s failed: %s", name, episode.failure.reason, extra=log_fields(episode))
            return Reply(503, f"the environment is unavailable: {episode.failure.reason}", refused=True)
        finally:
            episode.calls -= 1
            if not episode.calls:
                episode.no_calls.set()
            episode.last_used = time.monotonic()
            self.metrics.tool_called(name, time.perf_counter() - began)
        try:  # a result hosted code answered (an instance's: read from its JSON, its fields checked)
            return Reply(400 if result.isError is True else 200, str(result.text))
        except Exception as error:
            episode.failure = episode.failure or Failure(
                MALFORMED_REPLY, f"tool {name}: a result that is not one: {error!r}"
            )
            return Reply(503, f"the environment is unavailable: {episode.failure.reason}", refused=True)

    async def verify(self, key: str, final_text: str, task_id: str | None = None) -> Verdict:
        """Grade the episode, then tear it down. An episode that expired answers its masked verdict once; a verify
        with no episode to grade, or naming another task (``task_id``, the row's) than the one played, raises
        ``EpisodeStateError``: a verdict is never reported under a task the session did not play."""
        episode = self._episodes.get(key)
        if episode is None:
            return self._verdict_after_the_fact(key)
        if task_id is not None and task_id != episode.task.id:
            raise EpisodeStateError(
                f"this verify is for task {task_id!r}, but this session plays task {episode.task.id!r}; "
                "its episode goes on"
            )
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
                await self._lease_and_begin(episode)
            except Exception as error:
                episode.failure = classify(error, stage="seed")
                logger.warning(
                    "seeding task %r failed: %s", episode.task.id, episode.failure.reason, extra=log_fields(episode)
                )
                self.counters["seed_failed"] += 1
                await self._release(episode)
                self._seed_failed(episode)
            else:
                self.counters["seeded"] += 1
            if episode.key in self._closed and episode.failure is None:  # closed while seeding: close tears it down
                # The instance is fine: "cancelled" is not a kind that sends it to repair.
                episode.failure = Failure(CANCELLED, "the session was closed while its episode was being seeded")
            episode.last_used = time.monotonic()
        return episode

    async def _lease_and_begin(self, episode: Episode) -> None:
        """Lease an instance and begin the task on it. An instance that dies or drops while it is being seeded (a
        failure that breaks it) costs nothing yet, since no tool call has been answered: it is replaced and the seed
        takes another, within the lease's own time limit."""
        began = time.perf_counter()
        deadline = self.pool.lease_deadline()
        for attempt in range(1, _SEED_ATTEMPTS + 1):
            try:
                episode.instance = await self.pool.lease(deadline)
            finally:
                if attempt == 1:
                    self.metrics.seed_waited(time.perf_counter() - began)
            client = episode.instance.client
            try:
                await client.begin(episode.task.seed)
                episode.tools = await client.tool_session(
                    self.catalog, role=self.settings.role, timeout=self.settings.tool_timeout_s
                ).open()
                return
            except Exception as error:
                failure = classify(error, stage="seed")
                left = deadline - asyncio.get_running_loop().time()
                if not breaks_instance(failure) or attempt == _SEED_ATTEMPTS or left <= 0:
                    raise
                logger.warning(
                    "seeding task %r: instance %s failed (%s); seeding it on another",
                    episode.task.id,
                    episode.instance.index,
                    failure.reason,
                    extra=log_fields(episode),
                )
                self.counters["seeds_moved"] += 1
                await self._release_instance(episode, failure)

    def _seed_failed(self, episode: Episode) -> None:
        """An episode whose seed failed has ended, holding nothing: it is not open (a drain does not wait for it, the
        gauge does not count it), its tool calls are refused, and its verify answers its masked verdict once (a
        trainer that gives up on the rollout never sends one). A seed on the same session tries again."""
        assert episode.failure is not None
        if self._episodes.get(episode.key) is not episode:
            return
        del self._episodes[episode.key]
        if episode.key not in self._closed:
            self._verdicts.put(episode.key, Verdict.masked(episode.task.id, episode.failure))
        episode_ended(episode, None, self.metrics)

    async def _verify(self, episode: Episode, final_text: str) -> Verdict:
        async with episode.lock:
            if self._episodes.get(episode.key) is not episode:  # verified, closed or expired while we waited
                return self._verdict_after_the_fact(episode.key)
            await self._settle(episode)  # a tool call still running lands before the state is graded
            if episode.failure is not None:
                verdict = Verdict.masked(episode.task.id, episode.failure)
            else:
                verdict = await self._grade(episode, final_text)
            self._answer(episode.key, verdict)
            await self._teardown(episode, verdict.failure, verdict)
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
        pending = self._verdicts.get(key)
        if pending is not None and pending.failure is not None:
            if pending.failure.kind == SESSION_EXPIRED:
                return "this session's episode expired (no call for idle_timeout_s); /verify answers its masked verdict"
            return f"this session's episode could not start ({pending.failure.reason}); /verify answers it masked"
        if key in self._answered:
            return "this session's episode was already verified and has ended"
        if key in self._closed:
            return "this session was closed"
        return "no episode for this session: call /seed_session first, and send the cookies it answers"

    async def _grade(self, episode: Episode, final_text: str) -> Verdict:
        """Graded here against the task's criteria, from what the instance answers of them (its state, its
        extensions' or its own reward: ``Asked``, never the expected values); an instance that cannot answer masks
        the episode, never scores it."""
        assert episode.instance is not None
        try:
            asked = Asked.of(episode.task)
            observed = await episode.instance.client.observe(self.catalog, asked, final_text)
            if not isinstance(observed, Observation):
                raise MalformedReplyError(f"grading read a {type(observed).__name__}, not an observation")
            try:
                observed.answering(asked)
            except ValueError as error:
                raise MalformedReplyError(f"grading read {error}") from None
            outcome = observed.graded(episode.task.grading, final_text)
        except Exception as error:
            episode.failure = classify(error, stage="grading")
            return Verdict.masked(episode.task.id, episode.failure)
        return Verdict(episode.task.id, outcome.reward, outcome.results)

    async def _end(self, episode: Episode, failure: Failure | None) -> None:
        async with episode.lock:
            await self._teardown(episode, failure)

    async def _settle(self, episode: Episode) -> None:
        """With the episode's lock held: refuse new tool calls and wait for the ones running to end.

        An instance must not be graded, reset or handed to the next episode while a call is still changing it. A call
        ends within ``tool_timeout_s`` (its own limit); one that has not by then marks the episode timed out, which
        sends the instance to repair instead of back into the pool.
        """
        episode.ending = True
        if episode.calls:
            # At shutdown the server has already cut its requests short; their calls end at once.
            limit = _SETTLE_MARGIN_S if self._stopping else self.settings.tool_timeout_s + _SETTLE_MARGIN_S
            try:
                await asyncio.wait_for(episode.no_calls.wait(), limit)
            except TimeoutError:
                if episode.failure is None:
                    episode.failure = Failure(TIMEOUT, "a tool call did not end when its episode did")

    async def _teardown(self, episode: Episode, failure: Failure | None, verdict: Verdict | None = None) -> None:
        """With the episode's lock held: forget it, close its MCP session, give its instance back."""
        await self._settle(episode)
        if failure is not None and episode.failure is None:
            episode.failure = failure
        if self._episodes.get(episode.key) is episode:
            del self._episodes[episode.key]
            episode_ended(episode, verdict, self.metrics)
        if episode.tools is not None:
            tools, episode.tools = episode.tools, None
            with contextlib.suppress(Exception):
                await tools.close()
        await self._release(episode)

    async def _release(self, episode: Episode) -> None:
        await self._release_instance(episode, episode.failure)

    async def _release_instance(self, episode: Episode, failure: Failure | None) -> None:
        instance, episode.instance = episode.instance, None
        if instance is not None:
            await self.pool.release(instance, failure)

    async def _reap_idle(self) -> None:
        """The one sweeper: end episodes nobody touched for ``idle_timeout_s`` (a trainer that gave up mid-episode,
        and verifiers never calls /close_session, must not hold an instance forever; a late verify is answered
        ``session_expired``), and forget closed sessions and verdicts older than ``remember_s``."""
        settings = self.settings
        interval = max(0.25, min(30.0, settings.idle_timeout_s / 4, settings.remember_s / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for memory in (self._closed, self._verdicts, self._answered):
                memory.forget_before(now)
            cutoff = now - settings.idle_timeout_s
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
            failure = Failure(SESSION_EXPIRED, f"no call for {self.settings.idle_timeout_s:g}s (idle_timeout_s)")
            self._verdicts.put(episode.key, Verdict.masked(episode.task.id, failure))
            self.counters["expired"] += 1
            await self._teardown(episode, failure)
