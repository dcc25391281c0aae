"""gridsim: a walker on a grid with walls and a goal, as an agentenv-protocol environment.

The whole state lives in this process (one episode at a time), as the protocol intends:

- ``data/reset`` empties the grid; ``data/add`` takes one data part describing it:
  ``{"size": [w, h], "start": [x, y], "goal": [x, y], "walls": [[x, y], ...], "checkpoints": [[x, y], ...]}``
  (walls and checkpoints optional); ``data/get`` answers the state a grader reads (position, moves, bumps, ...).
- Tools: ``gridsim_move(direction)`` steps one cell; ``gridsim_look()`` tells where the walker is and which
  directions are open. x grows to the right, y grows upwards; (0, 0) is the bottom-left cell.
- Extension ``urn:gridsim:grade/v1`` (method ``grade``) scores the state: 1.0 on the goal (within ``max_moves``
  when given), else 0.0.

Run it alone with ``python env.py`` (MCP_HOST / MCP_PORT choose the address).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from agentenv_protocol import (
    AgentEnvEnvironment,
    AgentEnvError,
    DataPart,
    add_data,
    environment_card,
    extension,
    get_data,
    reset_data,
    tool,
)
from pydantic import Field

Direction = Literal["up", "down", "left", "right"]
STEPS: dict[str, tuple[int, int]] = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}
GRADE_URI = "urn:gridsim:grade/v1"


@environment_card(name="gridsim")
class GridEnv(AgentEnvEnvironment):
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.size: tuple[int, int] | None = None
        self.pos: tuple[int, int] | None = None
        self.goal: tuple[int, int] | None = None
        self.walls: set[tuple[int, int]] = set()
        self.checkpoints: list[tuple[int, int]] = []
        self.visited: list[tuple[int, int]] = []
        self.moves = 0
        self.bumps = 0

    @reset_data
    async def reset(self) -> None:
        self._clear()

    @add_data
    async def add(self, parts: list[Any]) -> None:
        grids = [part for part in parts if isinstance(part, DataPart)]
        if len(grids) != 1 or len(grids) != len(parts):
            raise ValueError("gridsim takes exactly one data part describing the grid")
        grid = grids[0].data
        width, height = _cell(grid.get("size"), "size")
        start, goal = _cell(grid.get("start"), "start"), _cell(grid.get("goal"), "goal")
        walls = {_cell(wall, "walls[]") for wall in grid.get("walls", [])}
        checkpoints = [_cell(point, "checkpoints[]") for point in grid.get("checkpoints", [])]
        for name, (x, y) in [("start", start), ("goal", goal), *[("checkpoint", c) for c in checkpoints]]:
            if not (0 <= x < width and 0 <= y < height) or (x, y) in walls:
                raise ValueError(f"{name} {[x, y]} is outside the grid or on a wall")
        self._clear()
        self.size, self.pos, self.goal, self.walls, self.checkpoints = (width, height), start, goal, walls, checkpoints
        self.visited = [start]

    @get_data
    async def get(self) -> list[DataPart]:
        if self.pos is None:
            return [DataPart(data={"loaded": False})]
        return [
            DataPart(
                data={
                    "loaded": True,
                    "pos": list(self.pos),
                    "goal": list(self.goal or ()),
                    "at_goal": self.pos == self.goal,
                    "moves": self.moves,
                    "bumps": self.bumps,
                    "visited": [list(cell) for cell in self.visited],
                    "checkpoints_reached": [list(c) for c in self.checkpoints if c in self.visited],
                }
            )
        ]

    @tool(name="{environment_name}_move")
    async def move(self, direction: Annotated[Direction, Field(description="Where to step.")]) -> dict[str, Any]:
        """Move one cell up, down, left or right; answers the new position, or an error at a wall or the edge."""
        x, y = self._position()
        dx, dy = STEPS[direction]
        target = (x + dx, y + dy)
        if not self._open(target):
            self.bumps += 1
            raise AgentEnvError("blocked", f"cannot move {direction} from {[x, y]}: {self._obstacle(target)}")
        self.pos = target
        self.moves += 1
        self.visited.append(target)
        return {"pos": list(target), "at_goal": target == self.goal}

    @tool(name="{environment_name}_look")
    async def look(self) -> dict[str, Any]:
        """Where the walker is, where the goal is, and which directions are open from here."""
        x, y = self._position()
        open_directions = [d for d, (dx, dy) in STEPS.items() if self._open((x + dx, y + dy))]
        return {"pos": [x, y], "goal": list(self.goal or ()), "open": open_directions, "moves": self.moves}

    @extension(GRADE_URI, description="Score the walk in [0, 1]: 1.0 on the goal, within max_moves when given.")
    async def grade(self, max_moves: int | None = None) -> dict[str, Any]:
        reached = self.pos is not None and self.pos == self.goal
        within = max_moves is None or self.moves <= max_moves
        return {"reward": 1.0 if reached and within else 0.0, "moves": self.moves, "at_goal": reached}

    def _position(self) -> tuple[int, int]:
        if self.pos is None:
            raise AgentEnvError("not_loaded", "no grid is loaded; the episode was not seeded")
        return self.pos

    def _open(self, cell: tuple[int, int]) -> bool:
        assert self.size is not None
        return 0 <= cell[0] < self.size[0] and 0 <= cell[1] < self.size[1] and cell not in self.walls

    def _obstacle(self, cell: tuple[int, int]) -> str:
        return f"wall at {list(cell)}" if cell in self.walls else "edge of the grid"


def _cell(value: Any, name: str) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise ValueError(f"{name} must be a pair of integers, got {value!r}")
    return value[0], value[1]


if __name__ == "__main__":
    GridEnv().serve()
