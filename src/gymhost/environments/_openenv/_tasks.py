"""An OpenEnv environment's own tasks (its Task API) as gymhost tasks, for ``gymhost write``.

OpenEnv tasks are whatever JSON an environment returns; what gymhost reads of each, by default:

- its **prompt**: the task's ``prompt``; for tasks without one, the reset observation's ``metadata.prompt`` (then its
  ``prompt``). ``--prompt-field POINTER`` names another place, as a JSON pointer looked up in the task, then in the
  reset observation. A prompt is a string (the user message), an object with ``user`` (and ``system``), or a list
  of chat messages (``role`` and ``content``). Beside a string prompt, the **system prompt** is the task's
  ``system_prompt``, else the reset observation's ``metadata.system_prompt`` where a reset was read;
- its **id**: the task's ``id`` (else ``task_id``, else ``name``, as agent-env names its tasks) when every task has a
  usable, unique one, else ``<split>-<index>``;
- its **reference solution**, for ``gymhost check``: ``solution.tool_calls``, each ``{"tool_name" or "name",
  "arguments"}``, and an optional ``solution.final_text``. A task without one is reported as not checked;
- its **tools**, when the environment lists none before a reset (agent-env's tools exist only inside an episode):
  what ``list_tools`` answers right after the task's reset, each task's own.

Every task is seeded by ``reset`` with its split and index and graded by the environment's own reward. Every reset
``gymhost write`` needs goes over one session.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .._errors import SourceError
from .._grading import MISSING, resolve_pointer
from .._settings import PoolSettings
from .._tasks import TASK_ID, Solution, Task
from ._client import OpenEnvLauncher
from ._task_api import TaskApi

__all__ = ["DEFAULT_PROMPT_FIELDS", "openenv_tasks"]

# Where a prompt is looked for by default: in the task, then in the reset observation (``data`` of its reply).
DEFAULT_PROMPT_FIELDS = {"task": ("/prompt",), "reset": ("/observation/metadata/prompt", "/observation/prompt")}
_SYSTEM_PROMPT_FIELDS = {"task": ("/system_prompt",), "reset": ("/observation/metadata/system_prompt",)}


async def openenv_tasks(
    api: TaskApi, launcher: OpenEnvLauncher, split: str | None, prompt_field: str | None, *, own_tools: bool
) -> dict[str, list[Task]]:
    """Every split's tasks (or ``split``'s), as gymhost tasks; with ``own_tools``, each with the tools its episode
    offers (the environment lists none before a reset)."""
    if prompt_field is not None and not (prompt_field == "" or prompt_field.startswith("/")):
        raise SourceError(f"--prompt-field {prompt_field!r}: expected a JSON pointer, like /prompt or /question/text")
    environment = launcher.environment
    splits = await api.splits(environment)
    if split is not None:
        if split not in splits:
            raise SourceError(
                f"{api.base_url}: OpenEnv environment {environment!r} has no split {split!r} "
                f"(splits: {', '.join(splits)})"
            )
        splits = [split]
    tasks: dict[str, list[Task]] = {}
    for name in splits:
        raw = await api.tasks(environment, name)
        if not raw:
            continue
        tasks[name] = await _converted(raw, name, launcher, prompt_field, own_tools)
    if not tasks:
        raise SourceError(f"{api.base_url}: OpenEnv environment {environment!r} lists no tasks in {', '.join(splits)}")
    return tasks


async def _converted(
    raw: list[Any], split: str, launcher: OpenEnvLauncher, prompt_field: str | None, own_tools: bool
) -> list[Task]:
    task_fields = (prompt_field,) if prompt_field is not None else DEFAULT_PROMPT_FIELDS["task"]
    reset_fields = (f"/observation{prompt_field}",) if prompt_field is not None else DEFAULT_PROMPT_FIELDS["reset"]
    prompts = {index: found for index, item in enumerate(raw) if (found := _first(item, task_fields)) is not MISSING}
    resets = [index for index in range(len(raw)) if own_tools or index not in prompts]
    observations: dict[int, dict[str, Any]] = {}
    tools: dict[int, list[dict[str, Any]] | None] = {}
    answers = await launcher.read_resets(
        [{"split": split, "index": index} for index in resets], PoolSettings(), tools=own_tools
    )
    for index, (observation, listed) in zip(resets, answers, strict=True):
        observations[index], tools[index] = observation, listed
        if index in prompts:
            continue
        found = _first(observation, reset_fields)
        if found is MISSING:
            where = ", ".join([f"the task's {p}" for p in task_fields] + [f"the reset's {p}" for p in reset_fields])
            raise SourceError(
                f"OpenEnv task {split}[{index}]: no prompt at {where}; name where it is with --prompt-field"
            )
        prompts[index] = found
    ids = _ids(raw, split)
    tasks = []
    for index, item in enumerate(raw):
        where = f"OpenEnv task {split}[{index}]"
        system = _first(item, _SYSTEM_PROMPT_FIELDS["task"])
        if system is MISSING and index in observations:
            system = _first(observations[index], _SYSTEM_PROMPT_FIELDS["reset"])
        try:
            tasks.append(
                Task.model_validate(
                    {
                        "id": ids[index],
                        "prompt": _prompt(prompts[index], None if system is MISSING else system, where),
                        "seed": {"reset": {"split": split, "index": index}},
                        "grading": {"criteria": [{"kind": "environment"}]},
                        "solution": _solution(item),
                        "tools": _tools(tools.get(index)) if own_tools else None,
                    }
                )
            )
        except ValidationError as error:
            raise SourceError(f"{where}: {error.errors()[0]['msg']}") from None
    return tasks


def _first(document: Any, pointers: tuple[str, ...]) -> Any:
    for pointer in pointers:
        value = resolve_pointer(document, pointer)
        if value is not MISSING and value is not None:
            return value
    return MISSING


def _ids(raw: list[Any], split: str) -> list[str]:
    """The environment's own ids (each task's ``id``, else its ``task_id``), else its names (``name``), whichever
    every task has a usable, unique one of; else ``<split>-<index>``."""
    items = [item if isinstance(item, dict) else {} for item in raw]
    for own in ([item.get("id", item.get("task_id")) for item in items], [item.get("name") for item in items]):
        if all(isinstance(value, str) and TASK_ID.match(value) for value in own) and len(set(own)) == len(own):
            return [str(value) for value in own]
    return [f"{split}-{index}" for index in range(len(raw))]


def _prompt(value: Any, system: Any, where: str) -> dict[str, Any]:
    """A prompt in gymhost's form; ``system`` is the system prompt found beside a string prompt."""
    if isinstance(value, str) and value.strip():
        return {"user": value, "system": system if isinstance(system, str) and system.strip() else None}
    if isinstance(value, dict) and isinstance(value.get("user"), str):
        return {"user": value["user"], "system": value.get("system")}
    if isinstance(value, list) and all(isinstance(message, dict) for message in value):
        by_role: dict[str, list[str]] = {"system": [], "user": []}
        for message in value:
            if message.get("role") in by_role and isinstance(message.get("content"), str):
                by_role[message["role"]].append(message["content"])
        if by_role["user"]:
            return {"user": "\n\n".join(by_role["user"]), "system": "\n\n".join(by_role["system"]) or None}
    raise SourceError(
        f"{where}: its prompt is not a string, an object with user (and system), or a list of chat messages: "
        f"{str(value)[:200]!r}"
    )


def _tools(listed: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``list_tools``' answer in the task format (``input_schema`` as MCP's ``inputSchema``)."""
    return [
        {
            "name": tool.get("name"),
            "description": tool.get("description") or "",
            "inputSchema": tool.get("input_schema") or tool.get("inputSchema") or {"type": "object"},
        }
        for tool in listed or []
    ]


def _solution(item: Any) -> dict[str, Any] | None:
    """The task's reference solution in gymhost's form, or None when it has none it can read."""
    solution = item.get("solution") if isinstance(item, dict) else None
    if not isinstance(solution, dict) or not isinstance(solution.get("tool_calls"), list):
        return None
    calls = []
    for call in solution["tool_calls"]:
        name = call.get("tool_name", call.get("name")) if isinstance(call, dict) else None
        if not isinstance(name, str):
            return None
        calls.append({"name": name, "arguments": call.get("arguments") or {}})
    final_text = solution.get("final_text")
    try:
        return Solution.model_validate(
            {"tool_calls": calls, "final_text": final_text if isinstance(final_text, str) else ""}
        ).model_dump()
    except ValidationError:
        return None
