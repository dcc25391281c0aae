"""sums: a small OpenEnv environment (``openenv`` 0.10.0) that carries its own tasks, for ``gymhost write URL ROOT``.

Some numbers are hidden; the model looks at them (``look``, or ``peek`` one by position) and submits their sum
(``submit``), which ends the episode with reward 1.0 if right and 0.0 if not. Ten steps without a submit end it at
0.0. Each task has an id, its split and index, the prompt, and a reference solution (``solution.tool_calls``), which
``gymhost check`` plays. It is a real OpenEnv app: ``MCPEnvironment`` with FastMCP tools, served by openenv's
``create_app`` under uvicorn, episodes over ``/ws`` and the Task API over HTTP.

Run it (in a venv with ``openenv``)::

    python examples/openenv_sums/server.py --port 8000 [--max-sessions N] [--no-tasks] [--max-steps N]
"""

from __future__ import annotations

import argparse
from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import ConcurrencyConfig, Observation, State

MAX_STEPS = 10  # steps without a submit before the episode ends at 0.0 (--max-steps)
PROMPT = (
    "Some numbers are hidden. Call look() to see them (or peek(position) for one), then call submit(answer) with "
    "their sum. You get reward 1.0 for the right sum."
)
NUMBERS = {"train": [[1, 2, 3], [10, 20], [4, 4, 4, 4]], "test": [[2, 5], [7, 8, 9], [100, -1]]}


def task(split: str, index: int) -> dict[str, Any]:
    if split not in NUMBERS:
        raise KeyError(f"unknown split {split!r}")
    if not 0 <= index < len(NUMBERS[split]):
        raise IndexError(index)
    calls = [
        {"tool_name": "look", "arguments": {}},
        {"tool_name": "submit", "arguments": {"answer": sum(NUMBERS[split][index])}},
    ]
    solution = {"tool_calls": calls}
    return {"id": f"{split}-{index}", "split": split, "index": index, "prompt": PROMPT, "solution": solution}


class SumsEnvironment(MCPEnvironment):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS = True  # every session has its own object and nothing is shared
    max_steps = MAX_STEPS

    def __init__(self) -> None:
        self._numbers: list[int] = []
        self._done = False
        self._earned: float | None = None  # what the current step earned
        self._state = State(episode_id=None, step_count=0)
        mcp = FastMCP("sums")

        @mcp.tool
        def look() -> dict[str, Any]:
            """The hidden numbers and the steps used so far."""
            return {"numbers": self._numbers, "steps": self._state.step_count}

        @mcp.tool
        def peek(position: int) -> int:
            """The number at `position` (0-based)."""
            if not 0 <= position < len(self._numbers):
                raise ValueError(f"position {position} is out of range 0..{len(self._numbers) - 1}")
            return self._numbers[position]

        @mcp.tool
        def submit(answer: int) -> str:
            """Submit the sum; this ends the episode."""
            right = answer == sum(self._numbers)
            self._done, self._earned = True, 1.0 if right else 0.0
            return "correct" if right else "wrong"

        super().__init__(mcp)

    # The Task API: openenv calls these on a fresh object for every HTTP request.
    def list_splits(self) -> list[Any]:
        return [{"name": "train", "type": "train"}, "test"]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [task(split, index) for index in range(len(NUMBERS[split]))]

    def num_tasks(self, split: str) -> int:
        return len(NUMBERS[split])

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return task(split, index)

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return self.list_tasks(split)[start:stop]

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, split: str = "train", index: int = 0, **_: Any
    ) -> Observation:
        current = task(split, int(index))
        self._numbers = list(NUMBERS[split][int(index)])
        self._done, self._earned = False, None
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0, task_id=current["id"])
        return Observation(metadata={"prompt": PROMPT, "task_id": current["id"]})

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        # MCPEnvironment gives no reward: a step's reward and done are the environment's to set (the /ws path).
        return self._rewarded(await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._rewarded(super().step(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unsupported action {type(action).__name__}"})

    def _rewarded(self, observation: Observation) -> Observation:
        if isinstance(observation, CallToolObservation):
            self._state.step_count += 1
            if not self._done and self._state.step_count >= self.max_steps:
                self._done, self._earned = True, 0.0
        observation.done, observation.reward = self._done, self._earned
        self._earned = None
        return observation

    @property
    def state(self) -> State:
        return self._state


class SumsWithoutTasks(SumsEnvironment):
    """The same environment with no Task API (its routes answer 501)."""

    list_splits = list_tasks = num_tasks = get_task = get_task_range = None  # type: ignore[assignment]


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=1, help="openenv's max_concurrent_envs (its default: 1)")
    parser.add_argument("--no-tasks", action="store_true", help="serve it without a Task API")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS, help="steps before an episode ends unsolved")
    args = parser.parse_args()
    SumsEnvironment.max_steps = args.max_steps
    environment = SumsWithoutTasks if args.no_tasks else SumsEnvironment
    app = create_app(
        environment,
        CallToolAction,
        CallToolObservation,
        env_name="sums",
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=args.max_sessions),
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
