"""A "faulty" environment bundle whose tools break its instance on demand, and helpers to watch a real server.

The environment is a counter (``add``; its one task scores 1.0 after ``add(2)``) with tools that each break the
instance the way real environments break:

- ``crash``: the instance's process dies mid-call (``os._exit``), so the connection drops without an answer.
  Process mode only: in-process, it would take the server with it.
- ``hang``: the call never answers.
- ``garbage``: the instance process writes bytes that are not a frame on its channel to the server, in the middle
  of this very call (``where="channel"``: process mode's wire), or its next reply on the data plane
  (``where="agentenv"``: a JSON-RPC reply with neither result nor error) is not the protocol.
- ``hang_next``: the instance's next reply on the data plane (or MCP) never comes.

The last two wrap the ASGI app the environment class builds (what both instance modes serve) in a middleware.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gymhost import EpisodeClient
from gymhost.environments import awrite_folder, write_folder

from .processes import STATE_TIMEOUT_S
from .verdicts import REFUSAL_STATUSES, read_verdict

FAULTY_ENV = '''
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from agentenv_protocol import AgentEnvEnvironment, DataPart, add_data, environment_card, get_data, reset_data, tool

NOT_THE_PROTOCOL = {
    "/agentenv": b'{"jsonrpc": "2.0", "id": 1}',  # neither result nor error
}


class Breaking:
    """ASGI middleware: the next reply on the path the environment names is garbage, or never comes."""

    def __init__(self, app: Any, env: "FaultyEnv") -> None:
        self.app, self.env = app, env

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.env.break_next and scope["path"] == self.env.break_next[0]:
            path, how = self.env.break_next
            self.env.break_next = None
            if how == "hang":
                await asyncio.Event().wait()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": NOT_THE_PROTOCOL[path]})
            return
        await self.app(scope, receive, send)


@environment_card(name="faulty")
class FaultyEnv(AgentEnvEnvironment):
    def __init__(self) -> None:
        delay = Path(__file__).with_name("start_delay")  # a slow start, when a test wants one (write_faulty)
        time.sleep(float(delay.read_text()) if delay.exists() else 0.0)
        self.count = 0
        self.hanging = False  # a tool call is hanging (data/get says so, for tests to see it is in progress)
        self.break_next: tuple[str, str] | None = None  # (path, "garbage" or "hang"): how its next reply breaks

    def create_app(self) -> Any:
        """The protocol's app, behind a middleware that breaks a reply when asked to."""
        mcp = super().create_app()
        build = mcp.streamable_http_app  # the ASGI app both instance modes serve

        def breaking_app() -> Any:
            app = build()
            app.add_middleware(Breaking, env=self)
            return app

        mcp.streamable_http_app = breaking_app
        return mcp

    @reset_data
    async def reset(self) -> None:
        self.count = 0

    @add_data
    async def add_parts(self, parts: list[Any]) -> None:
        self.count = parts[0].data["start"]

    @get_data
    async def get(self) -> list[DataPart]:
        return [DataPart(data={"count": self.count, "hanging": self.hanging})]

    @tool(name="add")
    async def add(self, n: int = 1) -> dict[str, Any]:
        """Add n to the counter."""
        self.count += n
        return {"count": self.count}

    @tool(name="crash")
    async def crash(self) -> dict[str, Any]:
        """The instance's process dies mid-call."""
        os._exit(17)

    @tool(name="hang")
    async def hang(self) -> dict[str, Any]:
        """Never answer."""
        self.hanging = True
        await asyncio.Event().wait()
        return {}

    @tool(name="garbage")
    async def garbage(self, where: str = "channel") -> dict[str, Any]:
        """Bytes that are not a frame on the channel now, or the next reply on /agentenv is not the protocol."""
        if where == "channel":
            import gc

            for wire in [obj for obj in gc.get_objects() if type(obj).__name__ == "_Framed"]:
                wire.transport.write(b"\\x00\\x00\\x00\\x08not one!")  # a length, then bytes that are no message
            return {"written": where}
        self.break_next = ("/" + where, "garbage")
        return {"armed": where}

    @tool(name="hang_next")
    async def hang_next(self, where: str = "agentenv") -> dict[str, Any]:
        """The instance's next reply on /mcp or /agentenv never comes."""
        self.break_next = ("/" + where, "hang")
        return {"armed": where}
'''

FAULTY_TASK = {
    "id": "make-two",
    "prompt": {"user": "Make the counter 2."},
    "seed": {"parts": [{"kind": "data", "data": {"start": 0}}]},
    "grading": {"criteria": [{"id": "two", "kind": "state", "path": "/count", "equals": 2}]},
    "solution": {"tool_calls": [{"name": "add", "arguments": {"n": 2}}]},
}

# nemo-gym 0.7.0's nemo_gym.failure_kinds.FAILURE_KINDS (0.4.0 has no such module), and its pattern for an
# environment's own ``<server>:<kind>``.
FAILURE_KINDS = frozenset(
    {
        "transport_unreachable",
        "transport_peer_drop",
        "transport_timeout",
        "transport_local_resource",
        "agent_run_error",
        "agent_request_failed",
        "agent_timeout",
        "agent_command_not_allowed",
        "judge_failed",
        "judge_unparseable",
        "verifier_error",
        "provider_unavailable",
        "provider_quota_exhausted",
        "provider_oom_killed",
        "session_lost",
        "session_expired",
        "session_release_failed",
        "cancelled",
        "kill_shaped",
        "shutdown",
        "persistence_failed",
        "cohort_incomplete",
    }
)
NAMESPACED_KIND = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")


def is_failure_kind(kind: object) -> bool:
    """One of nemo-gym's shared names, or a namespaced one of the environment's own."""
    return isinstance(kind, str) and (kind in FAILURE_KINDS or NAMESPACED_KIND.fullmatch(kind) is not None)


def make_faulty_bundle(root: Path, start_delay: float = 0.0) -> Path:
    """The bundle; its environment's constructor sleeps ``start_delay`` seconds (a file beside ``env.py``: an
    instance's environment holds none of the server's variables)."""
    bundle = root / "faulty_v1"
    (bundle / "tasks").mkdir(parents=True)
    (bundle / "env.py").write_text(FAULTY_ENV)
    (bundle / "tasks" / "eval.jsonl").write_text(json.dumps(FAULTY_TASK) + "\n")
    if start_delay:
        (bundle / "start_delay").write_text(str(start_delay))
    return bundle


def write_faulty(root: Path, *, mode: str = "process", instances: int = 1, start_delay: float = 0.0) -> Path:
    """The faulty bundle written as a Gym resources-server folder; answers the folder."""
    bundle = make_faulty_bundle(root / "bundles", start_delay)
    return write_folder(str(bundle), root / "written", mode=mode, instances=instances).path


async def awrite_faulty(root: Path, *, mode: str = "process", instances: int = 1, start_delay: float = 0.0) -> Path:
    """``write_faulty`` for async code."""
    bundle = make_faulty_bundle(root / "bundles", start_delay)
    return (await awrite_folder(str(bundle), root / "written", mode=mode, instances=instances)).path


def the_row(folder: Path) -> dict[str, Any]:
    (line,) = (folder / "data" / "eval.jsonl").read_text().splitlines()
    row: dict[str, Any] = json.loads(line)
    return row


async def play_right(base: str, row: dict[str, Any]) -> dict[str, Any]:
    """The task's reference play: seed, add(2), verify."""
    async with EpisodeClient(base) as episode:
        await episode.seed(row)
        await episode.call_tool("add", {"n": 2})
        return await episode.verify(row)


# -- many episodes ------------------------------------------------------------------------------------------------

# The tool calls each kind of episode makes after its seed. "play" is the reference play (reward 1.0); "abandon"
# stops mid-way and never verifies (only the idle TTL ends it); the others inject a fault, so their verify must
# be masked. Each fault comes after a normal call, or before the call that meets the garbage.
STEPS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "play": [("add", {"n": 2})],
    "abandon": [("add", {"n": 1})],
    "crash": [("add", {"n": 1}), ("crash", {})],
    "hang": [("add", {"n": 1}), ("hang", {})],
    "garbage-channel": [("add", {"n": 1}), ("garbage", {"where": "channel"})],
    "garbage-data": [("garbage", {"where": "agentenv"}), ("add", {"n": 2})],
}


@dataclass
class Outcome:
    """What one episode saw: every HTTP status, in order, verify's answer (None when it did not verify), and notes
    of what each call answered and when, for the failure message."""

    kind: str
    statuses: list[tuple[str, int]] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


class SharedPool(httpx.AsyncBaseTransport):
    """One pool of kept-alive connections for every episode of a load run: a load generator's client, cheaper than
    verifiers' connection per call. Closing an episode's client leaves it open; ``close`` closes it."""

    def __init__(self) -> None:
        self.pool = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.pool.handle_async_request(request)

    async def aclose(self) -> None:
        pass

    async def close(self) -> None:
        await self.pool.aclose()


async def run_episode(base: str, row: dict[str, Any], kind: str, transport: SharedPool) -> Outcome:
    """One episode of ``kind``, on the load run's shared connections."""
    outcome = Outcome(kind)
    async with EpisodeClient(base, transport=transport) as episode:
        seeded = await episode.post("/seed_session", row)
        outcome.statuses.append(("seed", seeded.status_code))
        outcome.notes.append(f"seeded at {time.monotonic():.3f}: {seeded.text[:300]}")
        if seeded.status_code != 200:
            return outcome
        episode.cookies.update(seeded.cookies)
        for name, arguments in STEPS[kind]:
            output = await episode.call_tool(name, arguments)
            outcome.statuses.append((name, output.status_code))
            outcome.notes.append(f"{name} answered at {time.monotonic():.3f}: {output.text[:200]}")
        if kind == "abandon":
            return outcome
        verified = await episode.post("/verify", {**row, "response": episode.transcript.response()})
        outcome.statuses.append(("verify", verified.status_code))
        if verified.status_code == 200 or verified.status_code in REFUSAL_STATUSES:
            outcome.verdict = read_verdict(verified)
    return outcome


async def run_many(
    base: str, row: dict[str, Any], kinds: list[str], *, concurrency: int, budget_s: float
) -> list[Outcome]:
    """Play ``kinds`` in order, ``concurrency`` at a time; no episode starts after ``budget_s`` seconds."""
    deadline = time.monotonic() + budget_s
    todo = iter(kinds)
    outcomes: list[Outcome] = []
    transport = SharedPool()

    async def worker() -> None:
        for kind in todo:
            if time.monotonic() > deadline:
                return
            outcomes.append(await run_episode(base, row, kind, transport))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await transport.close()
    return outcomes


def problems(outcomes: list[Outcome]) -> list[str]:
    """Every episode that did not end as it must: a played episode scores 1.0 unmasked, a faulted one is masked
    with a known failure_kind, an abandoned one was seeded; no call answers 500, seeds and verifies answer 200."""
    found = []
    for number, outcome in enumerate(outcomes):
        verdict = outcome.verdict or {}
        summary = {key: verdict.get(key) for key in ("reward", "mask_sample", "failure_kind", "failure_reason")}
        statuses = dict(outcome.statuses)
        verified = outcome.verdict is not None  # a 200, or a masked verdict refused
        if any(status >= 500 and status != 503 and call != "verify" for call, status in outcome.statuses):
            found.append(f"#{number} {outcome.kind}: a 5xx other than 503: {outcome.statuses}")
        elif statuses.get("seed") != 200 or (outcome.kind != "abandon" and not verified):
            found.append(f"#{number} {outcome.kind}: seed or verify failed: {outcome.statuses} {outcome.notes}")
        elif outcome.kind == "play" and (verdict["reward"], verdict["mask_sample"]) != (1.0, False):
            found.append(f"#{number} play did not score 1.0 unmasked: {summary} {outcome.statuses} {outcome.notes}")
        elif outcome.kind not in ("play", "abandon") and not (
            verdict["mask_sample"] is True and verdict["reward"] == 0.0 and is_failure_kind(verdict["failure_kind"])
        ):
            found.append(f"#{number} {outcome.kind} was not masked with a known failure_kind: {summary}")
    return found


# -- watching the server ------------------------------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], Any], timeout: float = STATE_TIMEOUT_S, interval: float = 0.1) -> Any:
    """Poll ``check`` until it answers something true; fail naming ``what`` and its last answer otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s (last: {answer!r})")
        time.sleep(interval)


async def await_for(
    what: str, check: Callable[[], Any], timeout: float = STATE_TIMEOUT_S, interval: float = 0.1
) -> Any:
    """``wait_for`` for async tests: ``check`` is synchronous, the waiting is not."""
    deadline = time.monotonic() + timeout
    while True:
        answer = await asyncio.to_thread(check)
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s (last: {answer!r})")
        await asyncio.sleep(interval)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")
