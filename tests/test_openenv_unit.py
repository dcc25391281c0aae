"""How OpenEnv's answers become what gymhost serves, without a server: tasks, prompts and ids from the Task API, a
step's observation as the model's text, the environment's reward as the reward, and the rules that keep agentenv
and OpenEnv tasks apart. (tests/test_openenv.py plays all of it against a real OpenEnv server.)"""

from __future__ import annotations

from typing import Any

import pytest

from gymhost.environments import CatalogError, SourceError, Task
from gymhost.environments._agentenv._backends import BUNDLE
from gymhost.environments._backend import Catalog
from gymhost.environments._catalog import check_tasks
from gymhost.environments._errors import EnvFailedError
from gymhost.environments._grading import Asked, evaluate
from gymhost.environments._openenv._backends import OPENENV
from gymhost.environments._openenv._client import OpenEnvClient, OpenEnvLauncher, _observation_result
from gymhost.environments._openenv._tasks import _converted
from gymhost.environments._openenv._wire import Tally, environment_error, openenv_catalog
from gymhost.environments._outcomes import classify
from gymhost.environments._settings import PoolSettings

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

CARD = openenv_catalog("sums", [{"name": "look", "description": "", "input_schema": {"type": "object"}}])
CARD_WITH_END_TURN = openenv_catalog("quiz", [{"name": "end_turn", "input_schema": {"type": "object"}}])


class Resets:
    """What ``_converted`` asks of a launcher: the reset observations of tasks without a prompt, and, for an
    environment with tools only inside an episode, what list_tools answers after each reset."""

    def __init__(self, observation: dict[str, Any], tools: dict[int, list[dict[str, Any]]] | None = None) -> None:
        self.observation = observation
        self.tools = tools or {}
        self.asked: list[dict[str, Any]] = []

    async def read_resets(
        self, resets: list[dict[str, Any]], settings: Any, *, tools: bool
    ) -> list[tuple[dict[str, Any], list[dict[str, Any]] | None]]:
        self.asked += resets
        return [(self.observation, self.tools.get(reset["index"], []) if tools else None) for reset in resets]


async def test_prompts_come_from_the_task_then_from_the_reset() -> None:
    raw = [
        {"id": "a", "prompt": "Add them."},
        {"id": "b", "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add."}]},
        {"id": "c"},
    ]
    resets = Resets({"observation": {"metadata": {"prompt": "From the reset."}}})
    tasks = await _converted(raw, "train", resets, None, False)  # type: ignore[arg-type]
    assert [task.prompt.user for task in tasks] == ["Add them.", "Add.", "From the reset."]
    assert tasks[1].prompt.system == "Be brief."
    assert resets.asked == [{"split": "train", "index": 2}]  # only the task without a prompt is reset
    assert [task.seed.reset for task in tasks] == [{"split": "train", "index": i} for i in range(3)]


async def test_a_prompt_field_names_another_place() -> None:
    raw = [{"question": {"text": "What is the sum?"}}]
    tasks = await _converted(raw, "test", Resets({}), "/question/text", False)  # type: ignore[arg-type]
    assert tasks[0].prompt.user == "What is the sum?"
    with pytest.raises(SourceError, match=r"test\[0\]: no prompt at the task's /nope, the reset's /observation/nope"):
        await _converted(raw, "test", Resets({}), "/nope", False)  # type: ignore[arg-type]


async def test_ids_are_the_environments_when_usable_and_unique() -> None:
    own = await _converted(
        [{"id": "x-1", "prompt": "p"}, {"task_id": "x-2", "prompt": "p"}], "s", Resets({}), None, False
    )  # type: ignore[arg-type]
    assert [task.id for task in own] == ["x-1", "x-2"]
    clash = await _converted([{"id": "x", "prompt": "p"}, {"id": "x", "prompt": "p"}], "s", Resets({}), None, False)  # type: ignore[arg-type]
    assert [task.id for task in clash] == ["s-0", "s-1"]
    odd = await _converted([{"id": "has space", "prompt": "p"}], "s", Resets({}), None, False)  # type: ignore[arg-type]
    assert [task.id for task in odd] == ["s-0"]


async def test_reference_solutions_are_read_in_either_spelling_or_left_out() -> None:
    raw = [
        {"prompt": "p", "solution": {"tool_calls": [{"tool_name": "look"}, {"name": "submit", "arguments": {"a": 1}}]}},
        {"prompt": "p", "solution": {"tool_calls": [{"arguments": {}}]}},  # no tool name: not a solution
        {"prompt": "p", "solution": "just do it"},
    ]
    tasks = await _converted(raw, "s", Resets({}), None, False)  # type: ignore[arg-type]
    assert tasks[0].solution is not None
    assert [(call.name, call.arguments) for call in tasks[0].solution.tool_calls] == [
        ("look", {}),
        ("submit", {"a": 1}),
    ]
    assert tasks[1].solution is None
    assert tasks[2].solution is None


@pytest.mark.parametrize(
    ("observation", "text", "is_error"),
    [
        (
            {"result": {"content": [{"type": "text", "text": "correct"}], "is_error": False}, "error": None},
            "correct",
            False,
        ),
        ({"result": {"content": [], "structured_content": {"n": [1, 2]}}, "error": None}, '{"n": [1, 2]}', False),
        ({"result": None, "error": {"error_type": "execution_error", "message": "boom"}}, "boom", True),
        ({"result": {"content": [{"type": "text", "text": "bad"}], "is_error": True}}, "bad", True),
    ],
)
def test_a_step_is_the_text_the_model_sees(observation: dict[str, Any], text: str, is_error: bool) -> None:
    result = _observation_result(observation, Tally())
    assert (result.text, result.isError) == (text, is_error)


async def test_agent_env_tasks_give_names_as_ids_system_prompts_and_their_own_tools() -> None:
    """agent-env's Task API: ids like @local/<path>/<name> (not usable), a name that is, a system prompt beside the
    prompt; its tools exist only after a reset, and differ by task."""
    raw = [
        {
            "id": "@local/quiz/tasks/capital",
            "name": "capital",
            "prompt": "Capital of France?",
            "system_prompt": "Terse.",
        },
        {"id": "@local/quiz/tasks/sum", "name": "sum", "prompt": "2 + 2?", "system_prompt": None},
    ]
    end_turn = {"name": "end_turn", "description": "End your turn.", "input_schema": {"type": "object"}}
    bash = {"name": "bash", "description": "Run a command.", "input_schema": {"type": "object"}}
    resets = Resets(
        {"observation": {"metadata": {"prompt": "x", "system_prompt": "From the reset."}}},
        {0: [end_turn], 1: [bash, end_turn]},
    )
    tasks = await _converted(raw, "all", resets, None, True)  # type: ignore[arg-type]
    assert [task.id for task in tasks] == ["capital", "sum"]
    assert [(task.prompt.user, task.prompt.system) for task in tasks] == [
        ("Capital of France?", "Terse."),
        ("2 + 2?", "From the reset."),  # the task gave none; its reset did
    ]
    assert [[tool.name for tool in task.tools or []] for task in tasks] == [["end_turn"], ["bash", "end_turn"]]
    assert resets.asked == [{"split": "all", "index": 0}, {"split": "all", "index": 1}]  # every task, for its tools


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"observation": {"metadata": {"status": "error", "error": "deploy failed"}}, "done": True}, "deploy failed"),
        ({"observation": {}, "metadata": {"status": "error", "error": "no reward: boom"}}, "no reward: boom"),
        ({"observation": {"metadata": {"status": "error"}}, "done": True}, "gave no reason"),
        ({"observation": {"metadata": {"scores": {"v": 1.0}}}, "reward": 1.0, "done": True}, None),
    ],
)
def test_an_observation_that_reports_an_error_is_the_environments_failure(
    data: dict[str, Any], error: str | None
) -> None:
    found = environment_error(data)
    assert (found is None) == (error is None)
    assert error is None or error in str(found)


def test_a_result_that_opens_the_next_turn_is_its_prompt() -> None:
    """agent-env's end_turn answers the next turn's prompt (and system prompt) as its result: the model sees the
    prompt, and the system prompt when the turn changes it."""
    tally = Tally(system_prompt="Be brief.")
    same = _observation_result({"result": {"prompt": "And now in German?", "system_prompt": "Be brief."}}, tally)
    assert (same.text, same.isError) == ("And now in German?", False)
    other = _observation_result({"result": {"prompt": "Now explain.", "system_prompt": "Be thorough."}}, tally)
    assert other.text == "System: Be thorough.\n\nNow explain."
    odd = _observation_result({"result": {"answer": 42}}, tally)  # a result that is not MCP content: its JSON
    assert odd.text == '{"answer": 42}'


class Frames:
    """A session that answers each request with the next frame given."""

    def __init__(self, *frames: dict[str, Any]) -> None:
        self.frames = list(frames)
        self.closed = False

    async def request(self, message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        return self.frames.pop(0)

    async def close(self) -> None:
        self.closed = True


def client_with(*frames: dict[str, Any], reply_tool: str | None = None) -> OpenEnvClient:
    client = OpenEnvClient(OpenEnvLauncher("http://x", "quiz", reply_tool=reply_tool), PoolSettings())
    client._session = Frames(*frames)  # type: ignore[assignment]
    return client


def observation(**data: Any) -> dict[str, Any]:
    return {"type": "observation", "data": {"observation": {}, "reward": None, "done": False, **data}}


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        (
            observation(done=True, metadata={"status": "error", "error": "TimeoutError: A2A task"}),
            "openenv:environment_error",
        ),
        (
            observation(observation={"error": {"error_type": "transport_error", "message": "502 Bad Gateway"}}),
            "transport_unreachable",
        ),
    ],
)
async def test_a_step_the_environment_could_not_serve_masks_the_episode(frame: dict[str, Any], kind: str) -> None:
    """An error observation (agent-env's run failed, its turn timed out) or a tool the environment could not reach is
    the infrastructure's failure: the call raises, and the episode is masked with that kind."""
    with pytest.raises(EnvFailedError) as failed:
        await client_with(frame).step("add", {}, 1.0)
    assert classify(failed.value, stage="tool add").kind == kind


async def test_a_tool_error_of_the_models_own_is_text_it_sees() -> None:
    frame = observation(observation={"error": {"error_type": "tool_not_found", "message": "offers no tool 'x'"}})
    result = await client_with(frame).step("x", {}, 1.0)
    assert (result.text, result.isError) == ("offers no tool 'x'", True)


async def test_verify_ends_the_open_turn_with_the_final_text_and_later_turns_with_none() -> None:
    """The reply tool is called with the final text, then with no reply for each turn the model never reached; the
    environment's reward of the last is the reward."""
    frames = [
        observation(observation={"result": {"prompt": "Second turn."}}),
        observation(reward=0.0, done=True, metadata={"scores": {"check": 0.0}}),
    ]
    client = client_with(*frames, reply_tool="end_turn")
    sent: list[dict[str, Any]] = []
    original = client._session.request  # type: ignore[union-attr]

    async def request(message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        sent.append(message["data"]["arguments"])
        return await original(message, timeout, what)

    client._session.request = request  # type: ignore[union-attr, method-assign]
    task = openenv_task()
    observed = await client.observe(CARD_WITH_END_TURN, Asked.of(task), "First answer.")
    outcome = observed.graded(task.grading, "First answer.")
    assert sent == [{"response": "First answer."}, {"response": ""}]
    assert (outcome.reward, client._tally.done) == (0.0, True)


async def test_an_episode_ended_without_any_reward_is_not_graded() -> None:
    client = client_with(observation(done=True))
    await client.step("submit", {}, 1.0)
    with pytest.raises(EnvFailedError) as failed:
        await client.observe(CARD, Asked.of(openenv_task()), "")
    assert classify(failed.value, stage="grading").kind == "openenv:no_reward"


def test_the_environments_reward_is_the_reward_as_it_is() -> None:
    """Not clamped to [0, 1] and not combined: an environment that pays 2.5 is answered 2.5."""
    task = openenv_task()
    outcome = evaluate(task.grading, state=None, extension_scores={}, final_text="", environment=(2.5, "paid 2.5"))
    assert outcome.reward == 2.5
    assert outcome.results[0].detail == "paid 2.5"


def test_an_environment_criterion_stands_alone() -> None:
    with pytest.raises(ValueError, match="an environment criterion is the only criterion"):
        Task.model_validate(
            {
                **openenv_task().model_dump(),
                "grading": {"criteria": [{"kind": "environment"}, {"kind": "response", "contains": "x"}]},
            }
        )


def test_tasks_are_seeded_and_graded_the_way_their_protocol_can() -> None:
    check_tasks({"t": [openenv_task()]}, CARD, OPENENV.check_task)
    agentenv_card = Catalog("counter", ({"name": "look"},))
    with pytest.raises(CatalogError, match=r"seed\.reset is for OpenEnv environments"):
        check_tasks({"t": [openenv_task()]}, agentenv_card, BUNDLE.check_task)
    no_reset = Task.model_validate({**openenv_task().model_dump(), "seed": {}})
    with pytest.raises(CatalogError, match=r"an OpenEnv task is seeded by seed\.reset"):
        check_tasks({"t": [no_reset]}, CARD, OPENENV.check_task)
    by_state = Task.model_validate(
        {**openenv_task().model_dump(), "grading": {"criteria": [{"kind": "state", "path": "/x", "equals": 1}]}}
    )
    with pytest.raises(CatalogError, match="a state criterion needs the agentenv data plane"):
        check_tasks({"t": [by_state]}, CARD, OPENENV.check_task)


def openenv_task() -> Task:
    return Task.model_validate(
        {
            "id": "train-0",
            "prompt": {"user": "Add."},
            "seed": {"reset": {"split": "train", "index": 0}},
            "grading": {"criteria": [{"kind": "environment"}]},
        }
    )
