"""What of an environment's card becomes part of a Gym server: its tools as routes, and the checks that tasks only
use what the card offers.

The writer and the server both run these checks, so a folder that was written against one version of an
environment and served against another fails at startup with the same message it would have got at write time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from agentenv_protocol.client import find_extension

from .._nemo_gym import GYM_ROUTE_NAMES as GYM_ROUTES
from ._exceptions import CatalogError
from ._tasks import EnvironmentCriterion, ExtensionCriterion, StateCriterion, Task

__all__ = [
    "GYM_ROUTES",
    "CatalogError",
    "card_tools",
    "check_tasks",
    "responses_tool",
    "server_tools",
    "task_tools",
]

# What OpenAI-style function names allow, which is also safe as one URL path segment.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def card_tools(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [tool for tool in (card.get("capabilities") or {}).get("tools") or [] if isinstance(tool, dict)]


def task_tools(task: Task, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools an episode of ``task`` offers: its own, when its environment has tools only inside an episode, else
    the environment's (``tools``, its policy tools)."""
    if task.tools is None:
        return tools
    return [tool.model_dump() for tool in task.tools]


def server_tools(card: dict[str, Any], hidden: Iterable[str], tasks: Iterable[Task]) -> list[dict[str, Any]]:
    """Every tool a server routes: the card's policy tools and the tools of every task that carries its own (an
    environment that lists its tools only inside an episode has none on its card). A call to one of them that the
    episode's task does not have still reaches the environment, which answers it as the model's error."""
    tools = {str(tool["name"]): tool for tool in card_tools(card) if tool.get("name") not in set(hidden)}
    for task in tasks:
        for tool in task.tools or []:
            tools.setdefault(tool.name, tool.model_dump())
    routed = _routable(card, list(tools.values()))
    if not routed:
        raise CatalogError(f"environment {card['name']!r} offers no tools a model may call, on its card or in a task")
    return routed


def _routable(card: dict[str, Any], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tools``, each checked to be a valid Gym route name that Gym does not claim."""
    for tool in tools:
        name = str(tool.get("name"))
        if not _TOOL_NAME.match(name):
            raise CatalogError(
                f"environment {card['name']!r}: tool {name!r} cannot be a Gym tool route; "
                "names must match [A-Za-z0-9_-]{1,64}"
            )
        if name in GYM_ROUTES:
            raise CatalogError(
                f"environment {card['name']!r}: tool {name!r} clashes with Gym's own /{name} route; rename the tool"
            )
    return tools


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A card tool as a Responses API function tool, the shape a Gym row's ``tools`` holds."""
    parameters = dict(tool.get("inputSchema") or {})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description") or "",
        "parameters": parameters,
        "strict": False,
    }


def check_tasks(
    tasks: dict[str, list[Task]], card: dict[str, Any], tool_names: Iterable[str], hidden: Iterable[str]
) -> None:
    """Every reference solution calls tools the policy has; every grade extension is on the card; a task is seeded
    and graded the way its environment's protocol can (an OpenEnv card says ``"protocol": "openenv"``).

    ``tasks`` maps where the tasks came from (a file, a split) to them, for the error messages.
    """
    offered, hidden = set(tool_names), set(hidden)
    for path, file_tasks in tasks.items():
        for task in file_tasks:
            allowed = offered if task.tools is None else {tool.name for tool in task.tools}
            for call in task.solution.tool_calls if task.solution else []:
                if call.name in hidden:
                    raise CatalogError(
                        f"{path}: task {task.id!r}: its solution calls {call.name!r}, which the environment "
                        "hides from models (hiddenByDefault)"
                    )
                if call.name not in allowed:
                    raise CatalogError(
                        f"{path}: task {task.id!r}: its solution calls {call.name!r}, which environment "
                        f"{card['name']!r} does not offer (tools: {', '.join(sorted(allowed))})"
                    )
            openenv = card.get("protocol") == "openenv"
            if openenv and (task.seed.reset is None or task.seed.parts):
                raise CatalogError(
                    f"{path}: task {task.id!r}: an OpenEnv task is seeded by seed.reset (the data of its reset "
                    "message, e.g. the split and index), not by data parts"
                )
            if not openenv and task.tools is not None:
                raise CatalogError(
                    f"{path}: task {task.id!r}: tools of its own are for OpenEnv environments whose tools exist only "
                    f"inside an episode; agentenv environment {card['name']!r} lists its tools on its card"
                )
            if not openenv and task.seed.reset is not None:
                raise CatalogError(
                    f"{path}: task {task.id!r}: seed.reset is for OpenEnv environments; {card['name']!r} is an "
                    "agentenv environment, seeded by seed.parts"
                )
            for criterion in task.grading.criteria:
                if openenv and isinstance(criterion, StateCriterion | ExtensionCriterion):
                    raise CatalogError(
                        f"{path}: task {task.id!r}: a {criterion.kind} criterion needs the agentenv data plane; an "
                        'OpenEnv environment is graded by its own reward ({"kind": "environment"}) or the final text'
                    )
                if not openenv and isinstance(criterion, EnvironmentCriterion):
                    raise CatalogError(
                        f"{path}: task {task.id!r}: grades with the environment's own reward, which agentenv "
                        f"environment {card['name']!r} does not give; use state, response or extension criteria"
                    )
                if isinstance(criterion, ExtensionCriterion) and find_extension(card, criterion.uri) is None:
                    raise CatalogError(
                        f"{path}: task {task.id!r}: grades with extension {criterion.uri}, which environment "
                        f"{card['name']!r} does not advertise on its card"
                    )
