"""Tool calls without HTTP answer what MCP over HTTP answers: in-process (``DirectToolSession``), and in an instance
process over its channel (``ChannelToolSession``).

The same instance is called over its streamable-HTTP endpoint through the in-memory ASGI transport (``McpSession``,
the protocol's own wire, as a URL instance is reached) and directly on its FastMCP server; a real instance process,
forked from the template as a process-mode server forks it, is called over its channel. Tool texts, error flags,
the caller an environment sees, its ``on_tool_call`` hook and the hidden tools' listing must agree.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvloop
from mcp.server.lowlevel.server import request_ctx

from gymhost import GymhostError
from gymhost.environments._agentenv._channel import ChannelToolSession
from gymhost.environments._agentenv._client import EnvClient, McpSession
from gymhost.environments._agentenv._direct import DirectToolSession
from gymhost.environments._agentenv._eager import start_eagerly
from gymhost.environments._agentenv._forking import BundleLauncher
from gymhost.environments._agentenv._launchers import InProcessLauncher
from gymhost.environments._backend import Catalog, Instance
from gymhost.environments._errors import EnvTimeoutError, McpSessionError
from gymhost.environments._settings import PoolSettings

from .agentenv_helpers import until_described
from .processes import STATE_TIMEOUT_S

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

PROBE_ENV = '''
import asyncio
import time
from typing import Any

from agentenv_protocol import AgentEnvEnvironment, AgentEnvError, DataPart, ToolContext, add_data, environment_card
from agentenv_protocol import get_data, reset_data, tool
from mcp.server.fastmcp import Context
from mcp.types import CallToolResult, TextContent


@environment_card(name="probe")
class ProbeEnv(AgentEnvEnvironment):
    def __init__(self) -> None:
        self.count = 0
        self.hook_seen: list[Any] = []

    @reset_data
    async def reset(self) -> None:
        self.count = 0
        self.hook_seen = []

    @add_data
    async def add(self, parts: list[Any]) -> None:
        self.count = parts[0].data["start"]

    @get_data
    async def get(self) -> list[DataPart]:
        return [DataPart(data={"count": self.count, "hooks": self.hook_seen})]

    @tool(name="increment")
    async def increment(self, by: int = 1) -> dict[str, Any]:
        """Add to the counter."""
        self.count += by
        return {"count": self.count}

    @tool(name="whoami")
    async def whoami(self, context: ToolContext, note: str = "") -> dict[str, Any]:
        """The caller as the protocol binds it."""
        return {"role": context.role, "session": context.caller.session, "tool": context.tool, "note": note}

    @tool(name="fail")
    async def fail(self) -> str:
        """Always refuses, with an AgentEnvError."""
        raise AgentEnvError("nope", "this tool always fails")

    @tool(name="crash")
    async def crash(self) -> str:
        """Raises a plain exception."""
        raise RuntimeError("boom")

    @tool(name="peek", hidden_by_default=True)
    async def peek(self) -> dict[str, Any]:
        """Plumbing; hidden."""
        return {"count": self.count}

    @tool(name="forbidden")
    async def forbidden(self) -> str:
        """on_tool_call refuses this one."""
        return "should never run"

    @tool(name="chatty")
    async def chatty(self, ctx: Context, steps: int = 2) -> str:
        """Logs and reports progress through FastMCP's Context."""
        await ctx.info("starting")
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
        return f"did {steps} steps"

    @tool(name="text_blocks")
    async def text_blocks(self) -> list[TextContent]:
        """Several text blocks."""
        return [TextContent(type="text", text="one"), TextContent(type="text", text="two \\u00e9\\u2603")]

    @tool(name="bad_output")
    async def bad_output(self, value: Any = "x") -> dict[str, int]:
        """Returns what its output schema refuses (when value is not an int)."""
        return {"a": value}

    @tool(name="sleepy")
    async def sleepy(self, seconds: float) -> str:
        """Takes a while."""
        await asyncio.sleep(seconds)
        return "woke"

    @tool(name="leave")
    async def leave(self) -> str:
        """Stops its process, as a tool calling sys.exit() does."""
        raise SystemExit(3)

    @tool(name="blocking")
    def blocking(self, seconds: float) -> str:
        """Holds its instance's event loop (not async)."""
        time.sleep(seconds)
        return "done"

    def on_tool_call(self, context: ToolContext) -> Any:
        self.hook_seen.append([context.tool, context.role])
        if context.tool == "forbidden":
            text = f"refused for role {context.role}"
            return CallToolResult(isError=True, content=[TextContent(type="text", text=text)])
        return None
'''

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("increment", {"by": 2}),
    ("increment", {}),
    ("increment", {"by": "3"}),  # coerced, as pydantic does
    ("increment", {"by": "x"}),  # bad argument
    ("increment", {"by": 1, "extra": True}),  # an argument the tool does not take
    ("whoami", {"note": "hi"}),
    ("fail", {}),  # AgentEnvError
    ("crash", {}),  # any other exception
    ("no_such_tool", {}),
    ("forbidden", {}),  # answered by on_tool_call
    ("peek", {}),  # hidden from listings, still callable
    ("chatty", {"steps": 3}),  # notifications to the client
    ("text_blocks", {}),
    ("bad_output", {}),  # fails its output schema
    ("bad_output", {"value": 3}),
    ("sleepy", {}),  # a required argument missing
]


@asynccontextmanager
async def probe(tmp_path: Path) -> AsyncIterator[Instance]:
    bundle = tmp_path / "probe"
    bundle.mkdir()
    (bundle / "env.py").write_text(PROBE_ENV)
    launcher = InProcessLauncher(bundle)
    instance = await launcher.launch(0, PoolSettings())
    try:
        yield instance
    finally:
        await launcher.stop(instance)


@asynccontextmanager
async def probe_process(tmp_path: Path) -> AsyncIterator[Instance]:
    """The probe in a real instance process, forked from the template, reached over its channel."""
    bundle = tmp_path / "probe"
    bundle.mkdir(exist_ok=True)
    (bundle / "env.py").write_text(PROBE_ENV)
    launcher = BundleLauncher(bundle)
    instance = await launcher.launch(0, PoolSettings())
    try:
        await until_described(instance)
        yield instance
    finally:
        await launcher.stop(instance)
        await launcher.close()


def over_channel(instance: Instance, role: str | None, timeout: float = 30.0) -> ChannelToolSession:
    session = instance.client.tool_session(Catalog("probe"), role=role, timeout=timeout)
    assert isinstance(session, ChannelToolSession)
    return session


def over_http(instance: Instance, role: str | None, timeout: float = 30.0) -> McpSession:
    """The instance's tools over MCP's streamable HTTP, as a process instance is reached."""
    session = EnvClient.tool_session(instance.client, Catalog("probe"), role=role, timeout=timeout)
    assert isinstance(session, McpSession)
    return session


def direct(instance: Instance, role: str | None, timeout: float = 30.0) -> DirectToolSession:
    session = instance.client.tool_session(Catalog("probe"), role=role, timeout=timeout)
    assert isinstance(session, DirectToolSession)
    return session


async def play(instance: Instance, session: Any) -> dict[str, Any]:
    await instance.client.clear()
    await session.open()
    answers = []
    for name, arguments in CALLS:
        result = await session.call_tool(name, arguments)
        text = result.text.replace(session.session_id, "<session>")
        answers.append((name, result.isError, text))
    tools = await session.list_tools()
    await session.close()
    state = await instance.client.state()
    return {"calls": answers, "tools": tools, "state": state}


@pytest.mark.parametrize("role", ["grader", None])
async def test_direct_and_channel_calls_answer_what_mcp_over_http_answers(tmp_path: Path, role: str | None) -> None:
    async with probe(tmp_path) as instance:
        http = await play(instance, over_http(instance, role))
        memory = await play(instance, direct(instance, role))
    async with probe_process(tmp_path) as instance:
        channel = await play(instance, over_channel(instance, role))
    assert memory == http
    assert channel == http
    calls = {name: (error, text) for name, error, text in memory["calls"]}
    # What the comparison covers, so that two equally broken paths cannot pass it.
    assert calls["fail"] == (True, "nope: this tool always fails")
    assert calls["forbidden"] == (True, f"refused for role {role}")
    assert calls["crash"][0]
    assert "boom" in calls["crash"][1]
    assert calls["no_such_tool"][0]
    assert "no_such_tool" in calls["no_such_tool"][1]
    assert re.search(r'"role": (null|"grader")', calls["whoami"][1])
    assert '"session": "<session>"' in calls["whoami"][1], "the caller's session is the MCP session"
    assert calls["chatty"] == (False, "did 3 steps")
    assert calls["text_blocks"] == (False, "one\ntwo \u00e9\u2603")
    hidden = [tool for tool in memory["tools"] if (tool.get("_meta") or {}).get("agentenv.io/hiddenByDefault")]
    assert [tool["name"] for tool in hidden] == ["peek"]


# Each path without HTTP: in this process, and in an instance process over its channel.
PATHS = {"direct": (probe, direct), "channel": (probe_process, over_channel)}


@pytest.mark.parametrize("path", PATHS)
async def test_a_call_past_its_time_limit_fails_as_a_timeout(tmp_path: Path, path: str) -> None:
    start, session_of = PATHS[path]
    async with start(tmp_path) as instance:
        session = await session_of(instance, None, timeout=0.2).open()
        with pytest.raises(EnvTimeoutError, match=r"did not answer within 0.2s"):
            await session.call_tool("sleepy", {"seconds": 5})
        assert (await session.call_tool("increment", {})).isError is False  # the session is still usable
        await session.close()
        with pytest.raises(McpSessionError):
            await session.call_tool("increment", {})


@pytest.mark.parametrize(("tool", "arguments"), [("increment", {}), ("sleepy", {"seconds": 0.01})])
async def test_a_direct_call_leaves_its_request_context_in_its_own_task(
    tmp_path: Path, tool: str, arguments: dict[str, Any]
) -> None:
    """A call runs in a task of its own, started at once: one that never waits (``increment``) answers before its
    task is scheduled, one that waits (``sleepy``) is awaited; either way what mcp's handler sets (its request
    context) stays in that task, and the caller's own context is untouched."""
    async with probe(tmp_path) as instance:
        session = await direct(instance, None).open()
        assert request_ctx.get(None) is None
        assert (await session.call_tool(tool, arguments)).isError is False
        assert request_ctx.get(None) is None
        await session.close()


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_call_that_stops_its_process_ends_the_event_loop(loop_factory: Any) -> None:
    """A call started at once that raises ``SystemExit`` ends its event loop, as it did from a scheduled task,
    instead of raising into its caller (in an instance process, the channel's read)."""

    async def stops() -> None:
        raise SystemExit(3)

    async def caller() -> None:
        try:
            started = start_eagerly(stops())
        except SystemExit:
            raise AssertionError("the exit was raised into the caller") from None
        assert started is None
        await asyncio.sleep(30)
        raise AssertionError("the event loop went on")

    with asyncio.Runner(loop_factory=loop_factory) as runner, pytest.raises(SystemExit):
        runner.run(caller())


async def test_a_tool_that_stops_its_instance_process_fails_the_call_and_ends_the_process(tmp_path: Path) -> None:
    """Through a whole call in an instance process: the call fails at once, saying why, instead of at its time
    limit, and the process ends instead of serving on without its event loop's exit."""
    async with probe_process(tmp_path) as instance:
        session = await over_channel(instance, None).open()
        with pytest.raises(GymhostError, match=r"the tool stopped its process"):
            await asyncio.wait_for(session.call_tool("leave", {}), 10)  # its own limit is 30 s
        await asyncio.wait_for(instance.process.wait(), STATE_TIMEOUT_S)


@pytest.mark.parametrize("path", PATHS)
async def test_sessions_of_concurrent_episodes_keep_their_own_callers(tmp_path: Path, path: str) -> None:
    start, session_of = PATHS[path]
    async with start(tmp_path) as instance:
        sessions = [await session_of(instance, f"role-{n}").open() for n in range(5)]
        answers = await asyncio.gather(*(session.call_tool("whoami", {}) for session in sessions))
        for n, (session, answer) in enumerate(zip(sessions, answers, strict=True)):
            assert f'"role": "role-{n}"' in answer.text
            assert session.session_id is not None
            assert session.session_id in answer.text


async def test_a_tool_that_blocks_its_instance_process_times_out_at_its_own_limit(tmp_path: Path) -> None:
    """A tool that is not async holds the instance's loop, so the instance cannot time it out itself: the server
    does, a moment later, and says the limit the tool had."""
    async with probe_process(tmp_path) as instance:
        session = await over_channel(instance, None, timeout=0.2).open()
        with pytest.raises(EnvTimeoutError, match=r"call_tool did not answer within 0.2s"):
            await session.call_tool("blocking", {"seconds": 3})
