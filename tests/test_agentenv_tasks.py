"""The task format and the grading arithmetic: what a task author sees when a task is wrong, and what it scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gymhost.environments import TaskError, load_tasks, task_schema
from gymhost.environments._grading import Asked, Observation, evaluate, extension_score, merge_state, resolve_pointer
from gymhost.environments._tasks import ExtensionCriterion, Grading, Task

from .conftest import REPO

pytestmark = pytest.mark.unit

GOOD = {
    "id": "reach",
    "prompt": {"system": "You walk.", "user": "Reach (1, 1)."},
    "seed": {"parts": [{"kind": "data", "data": {"size": [2, 2]}}]},
    "grading": {"criteria": [{"kind": "state", "path": "/pos", "equals": [1, 1]}]},
    "solution": {"tool_calls": [{"name": "move", "arguments": {"direction": "up"}}]},
}


def write_lines(tmp_path: Path, *lines: Any) -> Path:
    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def with_changes(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


def test_a_good_file_loads(tmp_path: Path) -> None:
    (task,) = load_tasks(write_lines(tmp_path, GOOD))
    assert task.id == "reach"
    assert task.solution is not None
    assert task.solution.tool_calls[0].arguments == {"direction": "up"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"eval\.jsonl:2: not valid JSON: Expecting property name enclosed in double quotes"),
        (with_changes(prompt={"system": "x"}), r"eval\.jsonl:2: prompt\.user: Field required"),
        (with_changes(id="has space"), r"eval\.jsonl:2: id: String should match pattern"),
        (with_changes(colour="red"), r"eval\.jsonl:2: colour: Extra inputs are not permitted"),
        (
            with_changes(grading={"criteria": [{"kind": "state", "path": "/pos", "equals": 1, "regex": "x"}]}),
            r"eval\.jsonl:2: grading\.criteria\.0: give exactly one of equals, contains, regex \(got equals, regex\)",
        ),
        (
            with_changes(grading={"criteria": [{"kind": "state", "path": "pos", "equals": 1}]}),
            r"eval\.jsonl:2: grading\.criteria\.0\.path: String should match pattern",
        ),
        (
            with_changes(grading={"criteria": [{"kind": "response", "regex": "(unclosed"}]}),
            r"eval\.jsonl:2: grading\.criteria\.0: regex '\(unclosed' does not compile",
        ),
        (
            with_changes(grading={"criteria": [{"kind": "vibes"}]}),
            r"eval\.jsonl:2: grading\.criteria\.0: Input tag 'vibes' found using 'kind' does not match",
        ),
        (with_changes(grading={"criteria": []}), r"eval\.jsonl:2: grading\.criteria: List should have at least 1 item"),
        (
            with_changes(
                grading={"combine": "weighted", "criteria": [{"kind": "response", "contains": "x", "weight": 0}]}
            ),
            r"eval\.jsonl:2: grading: weighted grading needs at least one criterion with a positive weight",
        ),
        (
            with_changes(seed={"parts": [{"kind": "data"}]}),
            r"eval\.jsonl:2: seed\.parts\.0\.data\.data: Field required",
        ),
        (GOOD, r"eval\.jsonl:2: id: 'reach' is already the id of line 1"),
    ],
    ids=[
        "bad-json",
        "missing-field",
        "bad-id",
        "unknown-field",
        "two-predicates",
        "pointer-without-slash",
        "bad-regex",
        "unknown-criterion",
        "no-criteria",
        "zero-weights",
        "bad-seed-part",
        "duplicate-id",
    ],
)
def test_a_bad_line_names_file_line_and_field(tmp_path: Path, line: Any, message: str) -> None:
    path = write_lines(tmp_path, GOOD, line)
    with pytest.raises(TaskError, match=message):
        load_tasks(path)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"eval\.jsonl: no tasks; expected one JSON object per line"):
        load_tasks(write_lines(tmp_path, ""))


def test_the_committed_schema_is_the_generated_one() -> None:
    committed = json.loads((REPO / "src/gymhost/environments/task.schema.json").read_text())
    assert committed == task_schema(), "regenerate it with: make schema"


def test_the_example_bundle_tasks_are_valid() -> None:
    tasks = load_tasks(REPO / "examples/gridsim_v1/tasks/eval.jsonl")
    assert len(tasks) >= 8
    assert all(task.solution is not None for task in tasks)
    kinds = {criterion.kind for task in tasks for criterion in task.grading.criteria}
    assert kinds == {"state", "response", "extension"}


STATE = {"pos": [1, 1], "name": "walker", "tags": ["a", "b"], "flags": {"x": True}, "a/b": 1, "m~n": 2, "zero": 0}


@pytest.mark.parametrize(
    ("pointer", "value"),
    [("", STATE), ("/pos", [1, 1]), ("/pos/1", 1), ("/a~1b", 1), ("/m~0n", 2), ("/flags/x", True)],
)
def test_json_pointers_resolve(pointer: str, value: Any) -> None:
    assert resolve_pointer(STATE, pointer) == value


@pytest.mark.parametrize("pointer", ["/nope", "/pos/2", "/pos/01", "/pos/x", "/name/0"])
def test_json_pointers_that_do_not_resolve(pointer: str) -> None:
    grading = Grading.model_validate({"criteria": [{"kind": "state", "path": pointer, "equals": None}]})
    outcome = evaluate(grading, state=STATE, extension_scores={}, final_text="")
    assert outcome.reward == 0.0
    assert outcome.results[0].detail == f"{pointer} is not in the state"


@pytest.mark.parametrize(
    ("criterion", "score"),
    [
        ({"path": "/pos", "equals": [1, 1]}, 1.0),
        ({"path": "/pos", "equals": [1.0, 1]}, 1.0),
        ({"path": "/flags/x", "equals": 1}, 0.0),
        ({"path": "/zero", "equals": False}, 0.0),
        ({"path": "/tags", "contains": "b"}, 1.0),
        ({"path": "/tags", "contains": "c"}, 0.0),
        ({"path": "/name", "contains": "walk"}, 1.0),
        ({"path": "/flags", "contains": "x"}, 1.0),
        ({"path": "/name", "regex": "^wal"}, 1.0),
        ({"path": "/pos", "regex": r"^\[1, 1\]$"}, 1.0),
    ],
)
def test_state_predicates(criterion: dict[str, Any], score: float) -> None:
    grading = Grading.model_validate({"criteria": [{"kind": "state", **criterion}]})
    assert evaluate(grading, state=STATE, extension_scores={}, final_text="").reward == score


@pytest.mark.parametrize(
    ("criterion", "text", "score"),
    [
        ({"contains": "(2, 1)"}, "I am at (2, 1).", 1.0),
        ({"contains": "AT"}, "I am at (2, 1).", 0.0),
        ({"contains": "AT", "ignore_case": True}, "I am at (2, 1).", 1.0),
        ({"equals": "done"}, "  done\n", 1.0),
        ({"regex": r"\bdown\b"}, "open: downhill", 0.0),
    ],
)
def test_response_predicates(criterion: dict[str, Any], text: str, score: float) -> None:
    grading = Grading.model_validate({"criteria": [{"kind": "response", **criterion}]})
    assert evaluate(grading, state=None, extension_scores={}, final_text=text).reward == score


def test_all_pass_needs_every_criterion() -> None:
    grading = Grading.model_validate(
        {"criteria": [{"kind": "response", "contains": "a"}, {"kind": "response", "contains": "b"}]}
    )
    assert evaluate(grading, state=None, extension_scores={}, final_text="a b").reward == 1.0
    assert evaluate(grading, state=None, extension_scores={}, final_text="a").reward == 0.0


def test_weighted_is_the_weighted_mean_including_extension_scores() -> None:
    grading = Grading.model_validate(
        {
            "combine": "weighted",
            "criteria": [
                {"kind": "response", "contains": "a", "weight": 3},
                {"kind": "extension", "uri": "urn:x:grade/v1", "weight": 1},
            ],
        }
    )
    outcome = evaluate(grading, state=None, extension_scores={1: 0.5}, final_text="a")
    assert outcome.reward == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)
    assert [result.id for result in outcome.results] == ["response-0", "extension-1"]


@pytest.mark.parametrize(("answer", "score"), [({"reward": 0.25}, 0.25), ({"reward": 7}, 1.0), ({"reward": True}, 1.0)])
def test_extension_answers_become_scores(answer: dict[str, Any], score: float) -> None:
    criterion = ExtensionCriterion(kind="extension", uri="urn:x:grade/v1")
    assert extension_score(criterion, answer) == score


def test_an_extension_answer_without_a_number_is_an_error() -> None:
    criterion = ExtensionCriterion(kind="extension", uri="urn:x:grade/v1", reward_key="score")
    with pytest.raises(ValueError, match=r"urn:x:grade/v1 answered no number at 'score'"):
        extension_score(criterion, {"reward": 1.0})


def test_data_parts_merge_in_order() -> None:
    parts = [
        {"kind": "data", "data": {"a": 1, "b": 1}},
        {"kind": "text", "text": "x"},
        {"kind": "data", "data": {"b": 2}},
    ]
    assert merge_state(parts) == {"a": 1, "b": 2}


def test_what_an_instance_answers_grading_is_checked_before_it_counts() -> None:
    """An instance hosts code gymhost did not write: its answer must be one to what was asked (a state object, a
    score in [0, 1] for each extension criterion asked, no other), or the episode is masked, never scored."""
    task = Task.model_validate(
        {
            "id": "t",
            "prompt": {"user": "go"},
            "grading": {
                "combine": "weighted",
                "criteria": [
                    {"kind": "state", "path": "/done", "equals": True},
                    {"kind": "response", "equals": "secret"},
                    {"kind": "extension", "uri": "urn:x:grade/v1"},
                ],
            },
        }
    )
    asked = Asked.of(task)
    assert (asked.state, list(asked.extensions)) == (True, [2])
    honest = Observation(state={"done": True}, extension_scores={2: 1.0})
    assert honest.answering(asked).graded(task.grading, "wrong").reward == pytest.approx(2 / 3)
    for forged in (
        Observation(state={"done": True}, extension_scores={2: 2.0}),  # outweighing the answer the server checks
        Observation(state={"done": True}, extension_scores={2: float("nan")}),
        Observation(state={"done": True}, extension_scores={}),
        Observation(state={"done": True}, extension_scores={1: 1.0, 2: 1.0}),
        Observation(state=None, extension_scores={2: 1.0}),
    ):
        with pytest.raises(ValueError, match=r"the state is|extension score"):
            forged.answering(asked)
