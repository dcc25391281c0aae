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

__all__ = ["GYM_ROUTES", "CatalogError", "card_tools", "check_tasks", "policy_tools", "responses_tool"]

# What OpenAI-style function names allow, which is also safe as one URL path segment.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def card_tools(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [tool for tool in (card.get("capabilities") or {}).get("tools") or [] if isinstance(tool, dict)]


def policy_tools(card: dict[str, Any], hidden: Iterable[str]) -> list[dict[str, Any]]:
    """The card's tools a model may call: all but the hidden ones, each a valid, unclaimed route name."""
    hidden = set(hidden)
    tools = [tool for tool in card_tools(card) if tool.get("name") not in hidden]
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
    if not tools:
        raise CatalogError(f"environment {card['name']!r} offers no tools a model may call")
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
    allowed, hidden = set(tool_names), set(hidden)
    for path, file_tasks in tasks.items():
        for task in file_tasks:
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
