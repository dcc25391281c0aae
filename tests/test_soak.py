"""Soak: many episodes on one real `gymhost serve` process, with faults injected and episodes abandoned mid-way.

Bounded in count and in time, loopback only; its own tier (`make test-soak`). What must hold over a long run:
every episode ends, as a reward or a masked sample with a failure_kind, and never as a 500; abandoned episodes are
expired by the idle TTL; and afterwards the server is back where it started: every instance free, no open episode,
nothing remembered past remember_s, its child processes exactly its instances, its file descriptors and resident
memory near what they were after a warm-up of the same shape. (Python seldom returns freed memory to the OS, so the
baseline is measured after a warm-up, and memory is compared with a bound, not for equality.)
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from .agentenv_helpers import pool_status_of
from .fault_helpers import Outcome, await_for, awrite_faulty, problems, rss_mb, run_many, the_row
from .processes import (
    ServerProcess,
    assert_stopped_cleanly,
    descendants,
    gymhost_command,
    hosting,
    instance_processes,
    parent,
    serving,
)

pytestmark = [
    pytest.mark.nemo_gym,
    pytest.mark.soak,
    pytest.mark.processes,
    pytest.mark.anyio,
    pytest.mark.usefixtures("clean_env"),
]

# Generous for a machine another job loads: a played episode's calls come milliseconds apart, seconds when both cores
# are busy, and must never be taken for idle or hung; the abandoned and the hung still end within seconds.
IDLE_TIMEOUT_S = 10  # abandoned episodes end ten seconds after their last call
REMEMBER_S = 15  # and every verdict and closed session is forgotten fifteen seconds after
TIME_LIMIT_S = 5  # tool_timeout_s and data_timeout_s: a hang costs five seconds


@contextmanager
def serve(folder: Path) -> Iterator[ServerProcess]:
    settings = {
        "idle_timeout_s": IDLE_TIMEOUT_S,
        "remember_s": REMEMBER_S,
        "tool_timeout_s": TIME_LIMIT_S,
        "data_timeout_s": TIME_LIMIT_S,
    }
    options = [word for key, value in settings.items() for word in ("--set", f"{key}={value}")]
    with serving(gymhost_command("serve", str(folder), "--port", "0", *options)) as server:
        yield server
    assert_stopped_cleanly(server)


def plan(mix: dict[str, float], count: int, seed: int) -> list[str]:
    """``count`` episode kinds drawn with the weights of ``mix``, the same on every run."""
    return random.Random(seed).choices(list(mix), weights=list(mix.values()), k=count)


async def settled(server: ServerProcess, instances: int) -> dict[str, Any]:
    """The pool once the run is over: every abandoned episode expired, every instance free (replacements up) and
    none being stopped, every verdict and closed session forgotten. Fails if that takes longer than the limits
    allow."""

    def quiet() -> dict[str, Any] | None:
        status = pool_status_of(server.url)
        done = (status["open_episodes"], status["free"], status["stopping"], status["remembered"]) == (
            0,
            instances,
            0,
            {"verdicts": 0, "closed": 0},
        )
        return status if done else None

    status: dict[str, Any] = await await_for("the pool settles", quiet, timeout=REMEMBER_S + 30)
    return status


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def accounted(outcomes: list[Outcome], before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What the server's counters say happened during the run, next to what the client saw."""
    kinds = Counter(outcome.kind for outcome in outcomes)
    delta = {key: after[key] - before[key] for key in ("seeded", "verified", "masked", "expired", "instances_replaced")}
    faults = sum(count for kind, count in kinds.items() if kind not in ("play", "abandon"))
    seen = {
        "seeded": len(outcomes),
        "verified": len(outcomes) - kinds["abandon"],
        "masked": faults,
        "expired": kinds["abandon"],
        "instances_replaced": faults,
    }
    return {key: delta[key] - seen[key] for key in delta if delta[key] != seen[key]}


FAULTS_BY_MODE = {
    # crash exits the instance's process: in-process, that would be the server's. Garbage on the channel is a fault
    # of the wire between the server and an instance process: in-process instances have no wire to break.
    "process": {"crash": 0.045, "hang": 0.045, "garbage-channel": 0.045, "garbage-data": 0.045},
    "in_process": {"hang": 0.09, "garbage-data": 0.09},
}


@pytest.mark.parametrize("mode", ["process", "in_process"])
async def test_faults_and_abandons_under_load_cost_only_their_episodes(tmp_path: Path, mode: str) -> None:
    """Sixteen instances, eight episodes at a time, 300 episodes after a warm-up of 60 of the same mix: 72% played
    right (each must score 1.0 unmasked), 10% abandoned after one call (expired by the idle TTL), 18% broken by
    a fault (each must be masked with a known failure_kind, and its instance replaced). The server's counters
    must agree with what the clients saw, and the server must come back to its warm-up baseline: its children
    exactly its instances (none in-process), its file descriptors within one an instance, its resident memory
    within 24 MB (measured on the project's two-core machine: +1 to +6 MB, which is allocator drift and the
    session middleware's cache of verified cookies, about 2 KB for each episode of the last 10 to 20 s)."""
    # Enough instances for the abandoned episodes, each holding one for idle_timeout_s, beside the eight in play.
    instances, concurrency, count, budget_s = 16, 8, 300, 900  # the budget bounds the tier; it is no speed test
    mix = {"play": 0.72, "abandon": 0.10, **FAULTS_BY_MODE[mode]}
    folder = await awrite_faulty(tmp_path, mode=mode, instances=instances)
    row = the_row(folder)
    with serve(folder) as server:
        pid = server.process.pid
        warm_up = await run_many(server.url, row, plan(mix, 60, seed=1), concurrency=concurrency, budget_s=budget_s)
        assert not problems(warm_up), problems(warm_up)
        before = await settled(server, instances)
        baseline_rss, baseline_fds = rss_mb(pid), open_fds(pid)

        outcomes = await run_many(server.url, row, plan(mix, count, seed=2), concurrency=concurrency, budget_s=budget_s)
        assert len(outcomes) == count, f"only {len(outcomes)} of {count} episodes started within {budget_s}s"
        assert not problems(outcomes), "\n".join(problems(outcomes))
        after = await settled(server, instances)
        assert not accounted(outcomes, before["counters"], after["counters"]), (
            accounted(outcomes, before["counters"], after["counters"]),
            after["counters"],
        )

        instance_pids = [instance["pid"] for instance in after["instances"]] if mode == "process" else []
        expected = [below for instance in instance_pids for below in instance_processes(instance)]
        for template in {parent(instance) for instance in instance_pids}:  # the template they were forked from
            expected += hosting(pid, template)
        # A stopped confined instance (the first process of its PID namespace) can stay a zombie for a moment after
        # the pool has counted it stopped: waited for, then any process left over is a leak.
        with suppress(AssertionError):
            await await_for("every stopped instance reaped", lambda: descendants(pid) == sorted(expected), timeout=10)
        processes = descendants(pid)
        assert processes == sorted(expected), f"the server's processes {processes}, its instances {expected}"
        fds, rss = open_fds(pid), rss_mb(pid)
        kinds = Counter((o.kind, (o.verdict or {}).get("failure_kind")) for o in outcomes)
        print(f"\n{mode}: {kinds}; fds {baseline_fds} -> {fds}; RSS {baseline_rss:.1f} -> {rss:.1f} MB")
        assert fds <= baseline_fds + instances, f"file descriptors: {baseline_fds} after the warm-up, now {fds}"
        assert rss - baseline_rss < 24, f"resident memory: {baseline_rss:.1f} MB after the warm-up, now {rss:.1f} MB"


async def test_ten_thousand_episodes_leave_memory_and_instances_at_the_idle_baseline(tmp_path: Path) -> None:
    """The session-lifecycle promise: after 10,000 episodes (in-process instances, 32 at a time), 10% of
    them abandoned mid-way and only ended by the idle TTL, every instance is free, no episode is open, nothing is
    remembered past remember_s, and resident memory is within 16 MB of the baseline after a warm-up of 1,000
    episodes of the same shape. Measured on the project's two-core machine: +7 MB, some of it the session
    middleware's cache of verified cookies (about 2 KB for each episode of the last 10 to 20 s, whatever remember_s
    says: up to 5 MB at this test's 125 episodes a second; when that cache kept a minute or two, it held all
    10,000 episodes and the test failed at +21 MB); 16 MB still catches a leak of 1.6 KB an episode."""
    # Enough instances for the abandoned episodes (about 8 a second, each holding one for idle_timeout_s) beside the
    # 32 in play.
    instances, concurrency, count, budget_s = 160, 32, 10_000, 1800  # the budget bounds the tier; no speed test
    mix = {"play": 0.9, "abandon": 0.1}
    folder = await awrite_faulty(tmp_path, mode="in_process", instances=instances)
    row = the_row(folder)
    with serve(folder) as server:
        pid = server.process.pid
        warm_up = await run_many(server.url, row, plan(mix, 1_000, seed=1), concurrency=concurrency, budget_s=600)
        assert not problems(warm_up), problems(warm_up)
        before = await settled(server, instances)
        baseline_rss = rss_mb(pid)

        outcomes = await run_many(server.url, row, plan(mix, count, seed=2), concurrency=concurrency, budget_s=budget_s)
        assert len(outcomes) == count, f"only {len(outcomes)} of {count} episodes started within {budget_s}s"
        assert not problems(outcomes), "\n".join(problems(outcomes)[:20])
        after = await settled(server, instances)
        assert not accounted(outcomes, before["counters"], after["counters"]), after["counters"]
        assert after["leased"] == after["repairing"] == after["waiting_seeds"] == 0
        assert descendants(pid) == []
        rss = rss_mb(pid)
        print(f"\n10,000 in-process episodes: RSS {baseline_rss:.1f} -> {rss:.1f} MB")
        assert rss - baseline_rss < 16, f"resident memory: {baseline_rss:.1f} MB after the warm-up, now {rss:.1f} MB"
