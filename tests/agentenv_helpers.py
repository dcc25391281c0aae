"""Bundles and environment processes for the agent-environment tests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx

from .conftest import REPO
from .processes import STATE_TIMEOUT_S, ServerProcess, free_port, serving

GRIDSIM = REPO / "examples" / "gridsim_v1"

# A second environment, small enough to read in a test: a counter, a hidden tool, a tool named by a parameter, and a
# seed that can be made slow.
COUNTER_ENV = '''
import asyncio
from typing import Any

import httpx

from agentenv_protocol import AgentEnvEnvironment, DataPart, add_data, environment_card, get_data, reset_data, tool

print("counter env: loading")  # an environment that prints must not confuse the instance's ready line


@environment_card(name="counter")
class CounterEnv(AgentEnvEnvironment):
    def __init__(self) -> None:
        self.count = 0

    @reset_data
    async def reset(self) -> None:
        self.count = 0

    @add_data
    async def add(self, parts: list[Any]) -> None:
        await asyncio.sleep(parts[0].data.get("slow", 0))  # a slow seed, for races with close and disconnects
        self.count = parts[0].data["start"]

    @get_data
    async def get(self) -> list[DataPart]:
        return [DataPart(data={"count": self.count})]

    @tool(name="{TOOL}")
    async def increment(self, by: int = 1) -> dict[str, Any]:
        """Add to the counter."""
        self.count += by
        return {"count": self.count}

    @tool(name="stall")
    async def stall(self, seconds: float) -> dict[str, Any]:
        """Take a while: an instance that stops answering."""
        await asyncio.sleep(seconds)
        return {"count": self.count}

    @tool(name="peek_answers", hidden_by_default=True)
    async def peek(self) -> dict[str, Any]:
        """Plumbing a task driver uses; never the model's."""
        return {"count": self.count}
'''

COUNTER_TASK = {
    "id": "count-to-3",
    "prompt": {"user": "Make the counter 3."},
    "seed": {"parts": [{"kind": "data", "data": {"start": 1}}]},
    "grading": {"criteria": [{"kind": "state", "path": "/count", "equals": 3}]},
    "solution": {"tool_calls": [{"name": "increment", "arguments": {"by": 2}}]},
}


def make_bundle(
    root: Path, name: str = "counter_v1", *, tasks: list[Any] | None = None, tool_name: str = "increment"
) -> Path:
    bundle = root / name
    (bundle / "tasks").mkdir(parents=True)
    (bundle / "env.py").write_text(COUNTER_ENV.replace("{TOOL}", tool_name))
    lines = [t if isinstance(t, str) else json.dumps(t) for t in (tasks if tasks is not None else [COUNTER_TASK])]
    (bundle / "tasks" / "eval.jsonl").write_text("\n".join(lines) + "\n")
    return bundle


def copy_gridsim(root: Path) -> Path:
    return Path(shutil.copytree(GRIDSIM, root / "gridsim_v1"))


@contextmanager
def environment_process(bundle: Path = GRIDSIM) -> Iterator[ServerProcess]:
    """The bundle's env.py run on its own (`python env.py`), as someone else's environment server would be."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"MCP_HOST": "127.0.0.1", "MCP_PORT": str(port), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    with serving(
        [sys.executable, str(bundle / "env.py")], cwd=bundle, env=env, url=url, ready_path="/.well-known/agent-env.json"
    ) as process:
        yield process


def rows(folder: Path, split: str = "eval") -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "data" / f"{split}.jsonl").read_text().splitlines() if line]


@asynccontextmanager
async def served(folder: Path, **overrides: Any) -> AsyncIterator[httpx.ASGITransport]:
    """The written server's app with its lifespan running (its instances up), reached in-process."""
    from gymhost import create_app

    app = create_app(folder, **overrides)
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)


async def until_described(instance: Any) -> None:
    """As the pool waits for a starting process instance: until it describes itself (30 s at most)."""
    from gymhost.environments._errors import EnvUnavailableError

    for _ in range(300):
        try:
            await instance.client.describe()
            return
        except EnvUnavailableError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"instance {instance.index} did not describe itself within 30 s")


async def pool_status(base: str, transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    """``GET /agentenv/pool`` of a written server, in-process (``transport``) or at ``base``."""
    async with httpx.AsyncClient(base_url=base, transport=transport) as client:
        answer: dict[str, Any] = (await client.get("/agentenv/pool")).json()
        return answer


async def settled_pool(base: str, transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    """``pool_status`` once every instance is free and none is starting or being stopped: process instances serve
    one episode each, and the pool replaces each as its episode ends."""
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while True:
        status = await pool_status(base, transport)
        instances = status["instances"]
        settled = not status["starting"] and not status["stopping"]
        settled = settled and len(instances) >= status["limits"]["min_instances"]
        if settled and all(instance["state"] == "free" for instance in instances):
            return status
        assert time.monotonic() < deadline, f"the pool did not settle within {STATE_TIMEOUT_S}s: {status}"
        await asyncio.sleep(0.05)


def pool_status_of(url: str) -> dict[str, Any]:
    """``pool_status`` of a server process, for synchronous tests and polling."""
    answer: dict[str, Any] = httpx.get(f"{url}/agentenv/pool", timeout=10).json()
    return answer


def reach_corner(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A written gridsim folder's reach-corner row, and the tool calls of that task's reference solution."""
    row = next(
        json.loads(line) for line in (folder / "data" / "eval.jsonl").read_text().splitlines() if "reach-corner" in line
    )
    task = next(
        json.loads(line)
        for line in (GRIDSIM / "tasks" / "eval.jsonl").read_text().splitlines()
        if "reach-corner" in line
    )
    return row, task["solution"]["tool_calls"]
