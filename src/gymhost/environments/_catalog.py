"""What of an environment's catalog becomes part of a Gym server: its tools as routes, and the checks that tasks only
use what it offers.

The writer and the server both run these checks, so a folder that was written against one version of an
environment and served against another fails at startup with the same message it would have got at write time.
The checks every protocol shares are here; what one protocol alone allows (how a task is seeded and graded) is its
backend's ``check_task``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from .._nemo_gym import GYM_ROUTE_NAMES as GYM_ROUTES
from ._backend import Catalog, Source
from ._errors import CatalogError
from ._tasks import Task

__all__ = [
    "GYM_ROUTES",
    "check_tasks",
    "checked",
    "responses_tool",
    "server_tools",
    "task_tools",
]

_MAX_CARD = 1 << 20  # an honest card, its tools' schemas included, is a few kilobytes

# What OpenAI-style function names allow, which is also safe as one URL path segment.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

TaskRule = Callable[[str, Task, Catalog], None]  # a backend's ``check_task``


def task_tools(task: Task, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools an episode of ``task`` offers: its own, when its environment has tools only inside an episode, else
    the environment's (``tools``, its policy tools)."""
    if task.tools is None:
        return tools
    return [tool.model_dump() for tool in task.tools]


def server_tools(catalog: Catalog, tasks: Iterable[Task]) -> list[dict[str, Any]]:
    """Every tool a server routes: the catalog's policy tools and the tools of every task that carries its own (an
    environment that lists its tools only inside an episode has none in its catalog). A call to one of them that the
    episode's task does not have still reaches the environment, which answers it as the model's error."""
    _sized(catalog)
    tools = {str(tool["name"]): tool for tool in catalog.policy_tools()}
    for task in tasks:
        for tool in task.tools or []:
            tools.setdefault(tool.name, tool.model_dump())
    routed = _routable(catalog, list(tools.values()))
    if not routed:
        raise CatalogError(f"environment {catalog.name!r} offers no tools a model may call, in its catalog or a task")
    return routed


def _routable(catalog: Catalog, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tools``, each checked to be a valid Gym route name that Gym does not claim, and to be JSON a client can
    read: the server's OpenAPI document and a dataset row's ``tools`` carry them."""
    for tool in tools:
        name = str(tool.get("name"))
        if not _TOOL_NAME.match(name):
            raise CatalogError(
                f"environment {catalog.name!r}: tool {name!r} cannot be a Gym tool route; "
                "names must match [A-Za-z0-9_-]{1,64}"
            )
        if name in GYM_ROUTES:
            raise CatalogError(
                f"environment {catalog.name!r}: tool {name!r} clashes with Gym's own /{name} route; rename the tool"
            )
        try:
            json.dumps(tool, allow_nan=False, ensure_ascii=False).encode()  # escaped, a lone surrogate would pass
        except (TypeError, ValueError, RecursionError) as error:  # NaN, a lone surrogate, bytes, nesting
            raise CatalogError(
                f"environment {catalog.name!r}: tool {name!r}: its description or input schema is not JSON a "
                f"client can read ({type(error).__name__}: {error})"
            ) from None
    return tools


def _sized(catalog: Catalog) -> None:
    """An environment's card (hosted code's) is at most ``_MAX_CARD`` as JSON: the server keeps it, copies what
    grading reads of it to instances, and writes its tools into every dataset row."""
    try:
        size = len(json.dumps(catalog.card, ensure_ascii=False, default=repr))
    except (ValueError, RecursionError) as error:
        raise CatalogError(f"environment {catalog.name!r}: its card is not JSON: {error}") from None
    if size > _MAX_CARD:
        raise CatalogError(
            f"environment {catalog.name!r}: its card is {size:,} characters of JSON; at most {_MAX_CARD:,}"
        )


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A catalog tool as a Responses API function tool, the shape a Gym row's ``tools`` holds."""
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


def check_tasks(tasks: dict[str, list[Task]], catalog: Catalog, rule: TaskRule) -> None:
    """Every reference solution calls tools the policy has, and every task keeps its protocol's rules (``rule``,
    the backend's ``check_task``).

    ``tasks`` maps where the tasks came from (a file, a split) to them, for the error messages.
    """
    offered = {str(tool["name"]) for tool in catalog.policy_tools()}
    for path, file_tasks in tasks.items():
        for task in file_tasks:
            allowed = offered if task.tools is None else {tool.name for tool in task.tools}
            for call in task.solution.tool_calls if task.solution else []:
                if call.name in catalog.hidden:
                    raise CatalogError(
                        f"{path}: task {task.id!r}: its solution calls {call.name!r}, which the environment "
                        "hides from models (hiddenByDefault)"
                    )
                if call.name not in allowed:
                    raise CatalogError(
                        f"{path}: task {task.id!r}: its solution calls {call.name!r}, which environment "
                        f"{catalog.name!r} does not offer (tools: {', '.join(sorted(allowed))})"
                    )
            rule(path, task, catalog)


def checked(source: Source, rule: TaskRule) -> Source:
    """``source`` with the tools its server routes, once its tasks have passed the checks."""
    source.tools = server_tools(source.catalog, (task for tasks in source.tasks.values() for task in tasks))
    check_tasks(
        {str(source.task_files.get(name, f"task split {name!r}")): tasks for name, tasks in source.tasks.items()},
        source.catalog,
        rule,
    )
    return source
