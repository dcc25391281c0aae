"""Grading an episode from its task's criteria: pure functions, no I/O.

The runtime gathers what the criteria need (the state from ``data/get``, the grade extension's answers, the
final assistant text) and hands it here. Keeping the arithmetic apart from the fetching keeps the line clear
between "the grader said 0" (a genuine reward) and "the grader could not run" (a masked sample), which the
runtime decides before calling in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._tasks import EnvironmentCriterion, ExtensionCriterion, Grading, ResponseCriterion, StateCriterion, Task, TaskTool

__all__ = [
    "MISSING",
    "Asked",
    "CriterionResult",
    "Observation",
    "Outcome",
    "evaluate",
    "extension_score",
    "merge_state",
    "resolve_pointer",
]

MISSING: Any = object()  # what resolve_pointer answers for a path that is not there


@dataclass(frozen=True)
class CriterionResult:
    id: str
    kind: str
    score: float
    detail: str

    @property
    def passed(self) -> bool:
        return self.score >= 1.0


@dataclass(frozen=True)
class Outcome:
    reward: float
    results: list[CriterionResult]


@dataclass(frozen=True)
class Asked:
    """What grading asks of an instance, and all it is told of its task's grading: whether its state is read, the
    extension criteria it scores (by their index in the grading), the tools the task offers. Never the expected
    values nor the solution: the server grades against those, out of reach of the hosted code, and of the model's
    code that an environment may run."""

    state: bool
    extensions: Mapping[int, ExtensionCriterion]
    tools: tuple[TaskTool, ...] | None

    @classmethod
    def of(cls, task: Task) -> Asked:
        criteria = task.grading.criteria
        return cls(
            state=any(isinstance(criterion, StateCriterion) for criterion in criteria),
            extensions={
                i: criterion for i, criterion in enumerate(criteria) if isinstance(criterion, ExtensionCriterion)
            },
            tools=tuple(task.tools) if task.tools is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Observation:
    """What an instance answers ``Asked``: what ``evaluate`` reads besides the final text."""

    state: Mapping[str, Any] | None = None
    extension_scores: Mapping[int, float] = field(default_factory=dict)
    environment: tuple[float, str] | None = None

    def answering(self, asked: Asked) -> Observation:
        """This observation, checked as an answer to ``asked`` (it comes from hosted code): a state object where one
        was asked for, a finite score in [0, 1] for each extension criterion and none other. ``ValueError`` if not."""
        if asked.state and not isinstance(self.state, Mapping):
            raise ValueError(f"the state is a {type(self.state).__name__}, not an object")
        scores = dict(self.extension_scores) if isinstance(self.extension_scores, Mapping) else None
        if scores is None or set(scores) != set(asked.extensions):
            raise ValueError("the extension scores answer other criteria than those asked")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in scores.values()):
            raise ValueError(f"an extension score outside [0, 1]: {scores}")
        environment = self.environment
        if environment is not None and not (
            isinstance(environment, tuple)
            and len(environment) == 2
            and isinstance(environment[0], int | float)
            and math.isfinite(environment[0])
            and isinstance(environment[1], str)
        ):
            raise ValueError(f"the environment's reward is not a finite number and its account: {environment!r}")
        return self

    def graded(self, grading: Grading, final_text: str) -> Outcome:
        return evaluate(
            grading,
            state=self.state,
            extension_scores=self.extension_scores,
            final_text=final_text,
            environment=self.environment,
        )


def evaluate(
    grading: Grading,
    *,
    state: Mapping[str, Any] | None,
    extension_scores: Mapping[int, float],
    final_text: str,
    environment: tuple[float, str] | None = None,
) -> Outcome:
    """The reward (in [0, 1], unless the environment's own reward is the grading) and each criterion's score.

    ``state`` is the merged ``data/get`` object (only read when a state criterion exists); ``extension_scores``
    maps the index of each extension criterion to the score its extension call produced; ``environment`` is the
    reward the environment gave and how (only read for an environment criterion, which stands alone).
    """
    results: list[CriterionResult] = []
    for index, criterion in enumerate(grading.criteria):
        name = criterion.id or f"{criterion.kind}-{index}"
        if isinstance(criterion, StateCriterion):
            assert state is not None, "state criteria need the environment's state"
            score, detail = _state_score(criterion, state)
        elif isinstance(criterion, ResponseCriterion):
            score, detail = _response_score(criterion, final_text)
        elif isinstance(criterion, EnvironmentCriterion):
            assert environment is not None, "an environment criterion needs the environment's reward"
            score, detail = environment
        else:
            score, detail = extension_scores[index], f"{criterion.uri} scored {extension_scores[index]:g}"
        results.append(CriterionResult(name, criterion.kind, score, detail))
    return Outcome(_combine(grading, results), results)


def extension_score(criterion: ExtensionCriterion, answer: Any) -> float:
    """The score in an extension's answer; raises ``ValueError`` when the answer carries none."""
    value = answer.get(criterion.reward_key) if isinstance(answer, Mapping) else None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return min(1.0, max(0.0, float(value)))
    raise ValueError(f"{criterion.uri} answered no number at {criterion.reward_key!r}: {json.dumps(answer)[:200]}")


def merge_state(parts: Sequence[Any]) -> dict[str, Any]:
    """The data parts of a ``data/get`` answer as one object; later parts win, text and file parts are skipped."""
    state: dict[str, Any] = {}
    for part in parts:
        data = part.get("data") if isinstance(part, Mapping) else getattr(part, "data", None)
        if isinstance(data, Mapping):
            state.update(data)
    return state


def resolve_pointer(document: Any, pointer: str) -> Any:
    """RFC 6901 JSON pointer lookup; ``MISSING`` when the path does not exist.

    Written here rather than taken from the ``jsonpointer`` package: it is fifteen lines and the only pointer
    operation gymhost needs.
    """
    if pointer == "":
        return document
    current = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(current, Mapping):
            if token not in current:
                return MISSING
            current = current[token]
        elif isinstance(current, list):
            if not token.isdigit() or int(token) >= len(current) or (token != "0" and token.startswith("0")):
                return MISSING
            current = current[int(token)]
        else:
            return MISSING
    return current


def _state_score(criterion: StateCriterion, state: Mapping[str, Any]) -> tuple[float, str]:
    value = resolve_pointer(state, criterion.path)
    if value is MISSING:
        return 0.0, f"{criterion.path} is not in the state"
    shown = json.dumps(value)[:120]
    if "equals" in criterion.model_fields_set:
        ok = _json_equal(value, criterion.equals)
        return float(ok), f"{criterion.path} = {shown}" + ("" if ok else f", expected {json.dumps(criterion.equals)}")
    if "contains" in criterion.model_fields_set:
        ok = _contains(value, criterion.contains)
        return float(ok), f"{criterion.path} = {shown} {'contains' if ok else 'lacks'} {json.dumps(criterion.contains)}"
    assert criterion.regex is not None
    text = value if isinstance(value, str) else json.dumps(value)
    ok = re.search(criterion.regex, text) is not None
    return float(ok), f"{criterion.path} = {shown} {'matches' if ok else 'does not match'} /{criterion.regex}/"


def _response_score(criterion: ResponseCriterion, final_text: str) -> tuple[float, str]:
    flags = re.IGNORECASE if criterion.ignore_case else 0
    text = final_text.strip()
    if criterion.equals is not None:
        expected = criterion.equals.strip()
        ok = text.casefold() == expected.casefold() if criterion.ignore_case else text == expected
        return float(ok), f"final text {'equals' if ok else 'differs from'} {expected!r}"
    if criterion.contains is not None:
        ok = re.search(re.escape(criterion.contains), text, flags) is not None
        return float(ok), f"final text {'contains' if ok else 'lacks'} {criterion.contains!r}"
    assert criterion.regex is not None
    ok = re.search(criterion.regex, text, flags) is not None
    return float(ok), f"final text {'matches' if ok else 'does not match'} /{criterion.regex}/"


def _combine(grading: Grading, results: list[CriterionResult]) -> float:
    if isinstance(grading.criteria[0], EnvironmentCriterion):  # alone, by the task format
        return results[0].score
    if grading.combine == "all_pass":
        return 1.0 if all(result.passed for result in results) else 0.0
    weights = [criterion.weight for criterion in grading.criteria]
    total = sum(weight * result.score for weight, result in zip(weights, results, strict=True))
    return min(1.0, max(0.0, total / sum(weights)))


def _json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON means it: ``true`` is not ``1``, but ``1`` is ``1.0``."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right  # Python compares int and float exactly, huge integers included
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right, strict=True))
    return bool(type(left) is type(right) and left == right)


def _contains(value: Any, expected: Any) -> bool:
    if isinstance(value, str):
        return isinstance(expected, str) and expected in value
    if isinstance(value, list):
        return any(_json_equal(item, expected) for item in value)
    if isinstance(value, Mapping):
        return isinstance(expected, str) and expected in value
    return False
