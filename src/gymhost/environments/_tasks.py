"""The task format: what one episode of an agent environment asks, how it is seeded, and how it is graded.

Tasks are JSON Lines, one task per line (``tasks/<split>.jsonl`` in a bundle, ``--tasks FILE`` for a URL source).
The models below are the format; ``task.schema.json`` beside this module is generated from them
(``make schema``) and a test keeps the two equal. Validation errors name the file,
the line and the field, so a task author can go straight to the mistake.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from agentenv_protocol import Part
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._errors import TaskError

__all__ = [
    "TASK_ID",
    "Criterion",
    "EnvironmentCriterion",
    "ExtensionCriterion",
    "Grading",
    "Prompt",
    "ResponseCriterion",
    "Seed",
    "Solution",
    "StateCriterion",
    "Task",
    "TaskError",
    "TaskTool",
    "ToolCall",
    "load_task_folder",
    "load_tasks",
    "task_schema",
    "write_task_folder",
]

TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # safe in a URL, a log line and a file name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Prompt(_Strict):
    """The messages the model starts from."""

    system: str | None = Field(default=None, description="The system message, if any.")
    user: str = Field(min_length=1, description="The user message that states the task.")


class Seed(_Strict):
    """What ``/seed_session`` loads into a fresh environment instance: an agentenv instance's ``data/add`` after
    its ``data/reset``, or an OpenEnv session's ``reset`` message."""

    parts: list[Part] = Field(default_factory=list, description="Parts for one `data/add` call; none skips it.")
    reset: dict[str, Any] | None = Field(
        default=None,
        description='OpenEnv only: the data of the session\'s reset message, e.g. {"split": "train", "index": 0}.',
    )


class _Predicate(_Strict):
    """Exactly one of ``equals``, ``contains`` and ``regex`` (on the state, ``equals: null`` is a predicate too)."""

    _null_is_a_value: ClassVar[bool] = False

    id: str | None = Field(default=None, description="A name for the criterion in verify's per-criterion results.")
    weight: float = Field(default=1.0, ge=0, description="Its weight when the grading combines by `weighted`.")

    @model_validator(mode="after")
    def _one_predicate(self) -> _Predicate:
        given = [name for name in ("equals", "contains", "regex") if name in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(f"give exactly one of equals, contains, regex (got {', '.join(given) or 'none'})")
        if getattr(self, given[0]) is None and not (given[0] == "equals" and self._null_is_a_value):
            raise ValueError(f"{given[0]} must not be null")
        regex = getattr(self, "regex", None)
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as error:
                raise ValueError(f"regex {regex!r} does not compile: {error}") from None
        return self


class StateCriterion(_Predicate):
    """A check on the environment's state after the episode, as ``data/get`` answers it.

    The data parts of the answer are merged into one object (later parts win) and ``path`` is a JSON pointer into
    it. ``contains`` means substring for strings, element for lists, key for objects; ``regex`` searches a string
    (other values as their JSON text). A path that does not resolve fails the criterion.
    """

    _null_is_a_value: ClassVar[bool] = True

    kind: Literal["state"]
    path: str = Field(pattern=r"^(/.*)?$", description="A JSON pointer (RFC 6901), e.g. /pos or /items/0/name.")
    equals: Any = None
    contains: Any = None
    regex: str | None = None


class ResponseCriterion(_Predicate):
    """A check on the model's final assistant text."""

    kind: Literal["response"]
    equals: str | None = None
    contains: str | None = None
    regex: str | None = None
    ignore_case: bool = False


class ExtensionCriterion(_Strict):
    """A score the environment computes itself, through a grade extension its card advertises.

    The extension answers a JSON object; the number at ``reward_key`` (true/false count as 1/0), clamped to
    [0, 1], is the criterion's score.
    """

    kind: Literal["extension"]
    id: str | None = None
    weight: float = Field(default=1.0, ge=0)
    uri: str = Field(min_length=1, description="The extension's URI on the environment card.")
    method: str | None = Field(default=None, description="Which of its methods; default the first advertised.")
    params: dict[str, Any] = Field(default_factory=dict)
    reward_key: str = "reward"


class EnvironmentCriterion(_Strict):
    """The reward the environment itself gave the episode, as it is (not clamped): for an OpenEnv environment, the
    sum of the rewards of the episode's steps. It is the grading's only criterion."""

    kind: Literal["environment"]
    id: str | None = None
    weight: float = Field(default=1.0, ge=0, description="Unused: the criterion stands alone.")


Criterion = Annotated[
    StateCriterion | ResponseCriterion | ExtensionCriterion | EnvironmentCriterion, Field(discriminator="kind")
]


class Grading(_Strict):
    """How the reward in [0, 1] is computed from the criteria.

    ``all_pass``: 1.0 when every criterion scores 1, else 0.0. ``weighted``: the weighted mean of the scores.
    """

    combine: Literal["all_pass", "weighted"] = "all_pass"
    criteria: list[Criterion] = Field(min_length=1)

    @model_validator(mode="after")
    def _weights_sum(self) -> Grading:
        if len(self.criteria) > 1 and any(isinstance(c, EnvironmentCriterion) for c in self.criteria):
            raise ValueError("an environment criterion is the only criterion: the environment's reward is the reward")
        if self.combine == "weighted" and sum(c.weight for c in self.criteria) <= 0:
            raise ValueError("weighted grading needs at least one criterion with a positive weight")
        return self


class ToolCall(_Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Solution(_Strict):
    """A reference play that solves the task: ``gymhost check`` expects it to score 1.0."""

    tool_calls: list[ToolCall] = Field(default_factory=list)
    final_text: str = ""


class TaskTool(_Strict):
    """A tool a task's episode offers, as the environment lists it (``list_tools``)."""

    name: str = Field(min_length=1)
    description: str = ""
    inputSchema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})  # the card's spelling


class Task(_Strict):
    """One task of an agent environment."""

    id: str = Field(pattern=TASK_ID.pattern, description="Unique within its file; rows name the task by it.")
    prompt: Prompt
    seed: Seed = Field(default_factory=Seed)
    grading: Grading
    solution: Solution | None = None
    tools: list[TaskTool] | None = Field(
        default=None,
        description="OpenEnv environments whose tools exist only inside an episode: the tools this task's episode "
        "offers, as list_tools answers after its reset. Unset: the environment's own tools, the same for every task.",
    )


def load_tasks(path: Path) -> list[Task]:
    """Read and validate one task file; the first problem raises ``TaskError`` naming file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TaskError(f"{path}: cannot read the task file: {error.strerror or error}") from None
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskError(f"{where}: not valid JSON: {error.msg} (column {error.colno})") from None
        try:
            task = Task.model_validate(raw)
        except ValidationError as error:
            raise TaskError(f"{where}: {_first_problem(error)}") from None
        if task.id in first_line:
            raise TaskError(f"{where}: id: {task.id!r} is already the id of line {first_line[task.id]}")
        first_line[task.id] = number
        tasks.append(task)
    if not tasks:
        raise TaskError(f"{path}: no tasks; expected one JSON object per line")
    return tasks


def load_task_folder(folder: Path) -> dict[str, list[Task]]:
    """Every ``<split>.jsonl`` in ``folder``, validated, by split name."""
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        raise TaskError(f"{folder}: no task files; expected <split>.jsonl files, e.g. {folder / 'eval.jsonl'}")
    return {path.stem: load_tasks(path) for path in files}


def _first_problem(error: ValidationError) -> str:
    problem = error.errors()[0]
    # Discriminated unions add the tag ('state', 'response', ...) to the location; it is not a field.
    location = ".".join(
        str(part) for part in problem["loc"] if part not in ("state", "response", "extension", "environment")
    )
    message = problem["msg"].removeprefix("Value error, ")
    return f"{location or '(task)'}: {message}"


def task_schema() -> dict[str, Any]:
    """The JSON Schema of one task line, as committed in ``task.schema.json``."""
    schema = Task.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://gymhost.dev/schemas/agentenv-task.schema.json"
    return schema


def write_task_folder(folder: Path, tasks: dict[str, list[Task]], files: dict[str, Path]) -> None:
    """``folder/<split>.jsonl`` for each split: the file the tasks came from, copied as it is, or the tasks written
    in this format (an OpenEnv server's own tasks)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, split_tasks in tasks.items():
        target = folder / f"{split}.jsonl"
        if split in files:
            target.write_bytes(files[split].read_bytes())
        else:
            lines = [task.model_dump_json(exclude_defaults=True) for task in split_tasks]
            target.write_text("\n".join(lines) + "\n", encoding="utf-8")
