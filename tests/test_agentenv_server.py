"""A written gridsim server, on real environment instances: episodes, failures, teardown, both session flows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient, create_app
from gymhost.environments import StartupError, Task, awrite_folder, load_tasks, write_folder

from .agentenv_helpers import (
    COUNTER_ENV,
    COUNTER_TASK,
    GRIDSIM,
    environment_process,
    make_bundle,
    pool_status,
    rows,
    served,
    settled_pool,
)
from .processes import (
    CALL_TIMEOUT_S,
    STATE_TIMEOUT_S,
    alive,
    assert_none_naming,
    assert_stopped_cleanly,
    descendants,
    gymhost_command,
    run_to_completion,
    serving,
)
from .verdicts import verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BASE = "http://gymhost.test"
TASKS: dict[str, Task] = {task.id: task for task in load_tasks(GRIDSIM / "tasks" / "eval.jsonl")}


def write_and_move(tmp_path_factory: pytest.TempPathFactory, mode: str) -> Path:
    """gridsim written into one root, then moved to another: a written folder is relocatable."""
    written = write_folder(str(GRIDSIM), tmp_path_factory.mktemp("written"), mode=mode).path
    moved = tmp_path_factory.mktemp("moved") / "resources_servers" / "gridsim_v1"
    moved.parent.mkdir()
    shutil.move(written, moved)
    return moved


@pytest.fixture(scope="module", params=["process", "in_process"])
def mode(request: pytest.FixtureRequest) -> str:
    """The same tests for both instance modes: loopback processes, and instances inside the server."""
    return str(request.param)


@pytest.fixture(scope="module")
def folder(mode: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_and_move(tmp_path_factory, mode)


@pytest.fixture(scope="module")
def process_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_and_move(tmp_path_factory, "process")


def row_for(folder: Path, task_id: str) -> dict[str, Any]:
    return next(row for row in rows(folder) if row["task_id"] == task_id)


async def play(
    base: str, row: dict[str, Any], *, right: bool = True, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    """The task's reference solution (right), or its first move only and no answer (wrong)."""
    solution = TASKS[row["task_id"]].solution
    assert solution is not None
    calls = solution.tool_calls if right else solution.tool_calls[:1]
    async with EpisodeClient(base, transport=transport) as episode:
        await episode.seed(row)
        for call in calls:
            await episode.call_tool(call.name, call.arguments)
        return await episode.verify(row, solution.final_text if right else "")


async def instance_state(base: str, index: int, transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    """An instance's data/get, read through the server (in-process instances have no address of their own)."""
    async with httpx.AsyncClient(base_url=base, transport=transport) as client:
        state: dict[str, Any] = (await client.get(f"/agentenv/pool/{index}")).json()["data"]
        return state


async def test_end_to_end_from_inside_the_written_folder(folder: Path, mode: str) -> None:
    """`python -m gymhost serve . --port 0` in the folder; a verifiers-like client; the episode torn down."""
    with serving(gymhost_command("serve", ".", "--port", "0"), cwd=folder) as server:
        for task_id in ("around-the-wall", "report-position", "efficient-diagonal"):
            answer = await play(server.url, row_for(folder, task_id))
            assert (answer["reward"], answer["mask_sample"], answer["failure_kind"]) == (1.0, False, None)
            assert answer["task_id"] == task_id
            assert all(criterion["score"] == 1.0 for criterion in answer["criteria"])
        status = await settled_pool(server.url)
        assert status["open_episodes"] == 0
        assert [instance["state"] for instance in status["instances"]] == ["free"] * 4
        # Process instances serve one episode each, and are replaced by fresh ones; in-process ones are reused.
        renewed = status["counters"]["instances_renewed"]
        assert (renewed, sum(instance["episodes"] for instance in status["instances"]) + renewed) == (
            3 if mode == "process" else 0,
            3,
        )
        for instance in status["instances"]:  # released instances were reset, or are new: no grid loaded
            assert await instance_state(server.url, instance["index"]) == {"loaded": False}
    assert_stopped_cleanly(server)


async def test_a_wrong_play_scores_zero_unmasked(folder: Path) -> None:
    async with served(folder) as transport:
        for task_id in ("corridor-east", "maze", "look-around", "efficient-diagonal"):
            answer = await play(BASE, row_for(folder, task_id), right=False, transport=transport)
            assert answer["mask_sample"] is False, answer
            assert answer["failure_kind"] is None
            assert answer["reward"] < 1.0
        answer = await play(BASE, row_for(folder, "maze"), right=False, transport=transport)
        assert answer["reward"] == 0.0
        assert [c["id"] for c in answer["criteria"] if c["score"] < 1] == ["at-goal"]


async def test_serving_in_process_says_its_code_shares_the_server(
    folder: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process instances run inside the server, secrets and all, and can never be confined: the start says so,
    once; process instances do not need saying it."""
    with caplog.at_level(logging.WARNING, logger="gymhost.environments"):
        async with served(folder):
            pass
    said = [record.getMessage() for record in caplog.records if "cannot be confined" in record.getMessage()]
    assert len(said) == (1 if mode == "in_process" else 0), said


async def test_a_folder_written_before_gymhost_environments_still_serves(tmp_path: Path) -> None:
    """Folders written by earlier gymhost import ``gymhost.agentenv.AgentEnvResourcesServer`` in their app.py: that
    path stays, and such a folder plays as a new one does."""
    folder = (await awrite_folder(str(GRIDSIM), tmp_path, mode="in_process")).path
    app_py = folder / "app.py"
    new = "from gymhost.environments import WrittenResourcesServer"
    old = app_py.read_text().replace(new, "from gymhost.agentenv import AgentEnvResourcesServer")
    old = old.replace("(WrittenResourcesServer)", "(AgentEnvResourcesServer)")
    assert "from gymhost.agentenv import AgentEnvResourcesServer" in old
    app_py.write_text(old)
    async with served(folder) as transport:
        answer = await play(BASE, row_for(folder, "maze"), transport=transport)
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False)


async def test_a_folder_written_before_the_servers_rename_still_serves(tmp_path: Path) -> None:
    """``tests/written_before/gridsim_v1`` was written by gymhost at a9cbcf8, when the server was
    ``AgentEnvResourcesServer``: its app.py imports that name, which names the same class as ``WrittenResourcesServer``,
    and the folder plays as a new one does."""
    import gymhost.agentenv
    import gymhost.environments

    committed = Path(__file__).parent / "written_before" / "gridsim_v1"
    assert "from gymhost.environments import AgentEnvResourcesServer" in (committed / "app.py").read_text()
    folder = Path(shutil.copytree(committed, tmp_path / "gridsim_v1"))
    async with served(folder) as transport:
        answer = await play(BASE, row_for(folder, "maze"), transport=transport)
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False)
    server = gymhost.environments.WrittenResourcesServer
    assert gymhost.environments.AgentEnvResourcesServer is server
    assert gymhost.agentenv.AgentEnvResourcesServer is server
    assert gymhost.environments.AgentEnvResourcesServerConfig is gymhost.environments.WrittenResourcesServerConfig


async def test_tool_errors_are_outputs_for_the_model(folder: Path) -> None:
    async with served(folder) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row_for(folder, "corridor-east"))
        blocked = await episode.call_tool("gridsim_move", {"direction": "up"})
        assert (blocked.status_code, blocked.text) == (400, "blocked: cannot move up from [0, 0]: edge of the grid")
        invalid = await episode.call_tool("gridsim_move", {"direction": "diagonal"})
        assert invalid.status_code == 400
        assert invalid.text.startswith("Error executing tool gridsim_move")
        not_json = await episode.post("/gridsim_look", [1, 2])  # type: ignore[arg-type]
        assert (not_json.status_code, not_json.json()) == (
            400,
            {"detail": "the arguments of gridsim_look must be a JSON object, not list"},
        )
        stranger = await EpisodeClient(BASE, transport=transport).call_tool("gridsim_look", {})
        assert stranger.status_code == 409
        assert "call /seed_session first" in json.loads(stranger.text)["detail"]
        unknown = await episode.call_tool("gridsim_fly", {})
        assert unknown.status_code == 404
        assert json.loads(unknown.text)["detail"].startswith("no tool 'gridsim_fly' here; the tools are: gridsim_")
        answer = await episode.verify(row_for(folder, "corridor-east"))
        assert (answer["reward"], answer["mask_sample"]) == (0.0, False)


async def test_killing_the_leased_instance_masks_the_episode_and_the_pool_recovers(process_folder: Path) -> None:
    folder = process_folder
    one_instance = {"source": {"instances": 1, "max_instances": 1}}
    async with served(folder, **one_instance) as transport:
        row = row_for(folder, "maze")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        await episode.call_tool("gridsim_move", {"direction": "up"})
        (instance,) = (await pool_status(BASE, transport))["instances"]
        os.kill(instance["pid"], signal.SIGKILL)
        output = await episode.call_tool("gridsim_move", {"direction": "up"})
        assert output.status_code == 503
        assert json.loads(output.text)["detail"].startswith("the environment is unavailable: tool gridsim_move: ")
        answer = await verdict(episode, row, "done")
        assert (answer["reward"], answer["mask_sample"]) == (0.0, True)
        # A kept-alive connection to the dead process resets (peer drop); a new one is refused (unreachable).
        assert answer["failure_kind"] in {"transport_peer_drop", "transport_unreachable"}
        assert answer["failure_reason"]
        # The next episode waits for the repaired instance and plays normally on it.
        answer = await play(BASE, row, transport=transport)
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False)
        (repaired,) = (await settled_pool(BASE, transport))["instances"]
        assert repaired["pid"] != instance["pid"]
        assert repaired["state"] == "free"


async def test_two_concurrent_episodes_never_see_each_others_state(folder: Path) -> None:
    async with served(folder, source={"instances": 2, "max_instances": 2}) as transport:
        east, north = row_for(folder, "corridor-east"), row_for(folder, "long-corridor")
        first, second = EpisodeClient(BASE, transport=transport), EpisodeClient(BASE, transport=transport)
        await asyncio.gather(first.seed(east), second.seed(north))
        for step in range(9):  # interleaved: any shared state would put one walker where the other went
            moves = [second.call_tool("gridsim_move", {"direction": "up"})]
            if step < 3:
                moves.append(first.call_tool("gridsim_move", {"direction": "right"}))
            outputs = await asyncio.gather(*moves)
            assert all(output.ok for output in outputs), outputs
        looks = await asyncio.gather(first.call_tool("gridsim_look"), second.call_tool("gridsim_look"))
        assert [json.loads(look.text)["pos"] for look in looks] == [[3, 0], [0, 9]]
        answers = await asyncio.gather(first.verify(east), second.verify(north))
        assert [answer["reward"] for answer in answers] == [1.0, 1.0]


async def test_seed_is_idempotent_and_refuses_conflicts(folder: Path) -> None:
    async with served(folder) as transport:
        row = row_for(folder, "corridor-east")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        await episode.call_tool("gridsim_move", {"direction": "right"})
        again = await episode.post("/seed_session", row)
        assert again.status_code == 200
        assert json.loads((await episode.call_tool("gridsim_look")).text)["pos"] == [1, 0]  # not re-seeded
        other = await episode.post("/seed_session", row_for(folder, "maze"))
        assert other.status_code == 409
        assert "already seeded with task 'corridor-east'" in other.json()["detail"]
        unknown = await EpisodeClient(BASE, transport=transport).post("/seed_session", {**row, "task_id": "nope"})
        assert (unknown.status_code, unknown.json()["detail"]) == (404, "no task 'nope' in split 'eval'")
        assert (await pool_status(BASE, transport))["open_episodes"] == 1


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh instances", "reused instances"])
async def test_close_session_tears_the_episode_down(folder: Path, fresh: bool) -> None:
    """Closed, the episode's instance is replaced (process instances, fresh for each episode) or cleared."""
    source = {"instances": 1, "max_instances": 1, "fresh_instances": fresh}
    async with served(folder, source=source) as transport:
        row = row_for(folder, "corridor-east")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        await episode.call_tool("gridsim_move", {"direction": "right"})
        assert (await episode.post("/close_session", {})).status_code == 200
        status = await settled_pool(BASE, transport)
        (instance,) = status["instances"]
        assert (status["open_episodes"], instance["state"]) == (0, "free")
        assert await instance_state(BASE, instance["index"], transport) == {"loaded": False}
        late = await episode.post("/verify", {**row, "response": episode.transcript.response("")})
        assert late.status_code == 409
        assert late.json() == {"detail": "this session was closed; there is nothing to verify"}
        assert (await episode.post("/seed_session", row)).status_code == 409


async def test_a_verify_mid_episode_spends_the_session_and_earns_nothing(folder: Path) -> None:
    """Gym's agents POST any function call the model makes to ``/<its name>`` with the episode's cookie, so the model
    can call ``verify`` itself mid-episode, with a transcript of its own making: it is graded (the criteria say what
    was expected), and the episode is over. A seed on that session does not start it over (the model would replay
    what it learned), and the trainer's own verify is refused (409, the first verdict repeated): a failed rollout,
    never a reward."""
    async with served(folder, source={"instances": 1, "max_instances": 1}) as transport:
        row = row_for(folder, "corridor-east")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        rogue = await episode.post("/verify", {"responses_create_params": {"input": []}, **_a_response("a guess")})
        assert (rogue.status_code, rogue.json()["reward"]) == (200, 0.0), rogue.text
        again = await episode.post("/seed_session", row)
        assert again.status_code == 409, again.text
        assert again.json()["detail"].endswith("was verified; a new episode needs a new session"), again.text
        for direction in ("right", "right", "right"):  # the walk the criteria asked for, played too late
            assert (await episode.call_tool("gridsim_move", {"direction": direction})).status_code == 409
        late = await episode.post("/verify", {**row, "response": episode.transcript.response("")})
        assert late.status_code == 409, late.text
        assert late.json()["verdict"]["reward"] == 0.0, late.text
        fresh = EpisodeClient(BASE, transport=transport)  # a new episode, in a new session, is another matter
        await fresh.seed(row)
        assert (await pool_status(BASE, transport))["open_episodes"] == 1


async def test_a_verify_of_another_tasks_row_is_refused_and_the_episode_goes_on(folder: Path) -> None:
    """A verdict is never reported under a task the session did not play: a verify whose row names another task is
    refused, ungraded, and the episode's own verify grades it."""
    async with served(folder) as transport:
        row, other = row_for(folder, "reach-corner"), row_for(folder, "corridor-east")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        for call in TASKS["reach-corner"].solution.tool_calls:  # type: ignore[union-attr]
            assert (await episode.call_tool(call.name, call.arguments)).ok
        refused = await episode.post("/verify", {**other, "response": episode.transcript.response("")})
        assert refused.status_code == 409, refused.text
        assert "this session plays task 'reach-corner'" in refused.json()["detail"], refused.text
        assert (await episode.verify(row))["reward"] == 1.0


async def test_a_model_cannot_move_its_episode_to_a_task_of_its_choice_or_end_another(
    folder: Path, gym_version: tuple[int, ...]
) -> None:
    """Through Gym's agents (function calls POSTed to ``/<name>`` with the episode's cookie, each answer's Set-Cookie
    kept for the trainer's verify), a model could seed again with a task of its choice and be graded on that: on its
    own session once the server has forgotten it (``remember_s``), or, on nemo-gym 0.5+, on a session its seed names;
    or close another rollout's session by name. A session's cookie says it played an episode: each is a 409, and the
    other rollout plays on."""

    async def agent_post(path: str, body: dict[str, Any]) -> httpx.Response:
        answer = await model.post(path, body)
        model.cookies.update(answer.cookies)  # as simple_agent keeps them
        return answer

    def named(session: str, task: str) -> dict[str, Any]:
        ids = {"resources_session_id": session, "episode_id": {"rollout_id": "r"}}
        task_data = {"task_id": task, "split": "eval"}
        return {**ids, "task_id": {"taskset": "gridsim", "task_id": task}, "task_data": task_data}

    resources_flow = gym_version >= (0, 5)
    async with served(folder, source={"instances": 2, "max_instances": 2}, remember_s=1) as transport:
        row, easy = row_for(folder, "corridor-east"), row_for(folder, "reach-corner")
        model, other = EpisodeClient(BASE, transport=transport), EpisodeClient(BASE, transport=transport)
        await model.seed(row)
        move = named("the-models-own", "reach-corner")
        close_other = {"resources_session_id": "rs-other", "episode_id": {"rollout_id": "r"}}
        if resources_flow:
            await other.seed(named("rs-other", "corridor-east"))
            assert (await agent_post("/close_session", close_other)).status_code == 409
        else:
            await other.seed(row)
            assert (await agent_post("/seed_session", move)).status_code == 422  # no such flow: a row without a task
        assert (await agent_post("/close_session", {})).status_code == 200  # its own: allowed, and it ends there
        if resources_flow:  # its closed session's cookie still binds the request
            assert (await agent_post("/close_session", close_other)).status_code == 409
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (await pool_status(BASE, transport))["remembered"]["closed"]:  # the server forgets the model's session
            assert time.monotonic() < deadline, "the closed session was never forgotten"
            await asyncio.sleep(0.2)
        for attempt in [move, easy] if resources_flow else [easy]:
            refused = await agent_post("/seed_session", attempt)
            assert refused.status_code == 409, refused.text
            assert "played an episode" in refused.json()["detail"], refused.text
        assert (await pool_status(BASE, transport))["open_episodes"] == 1  # the other rollout's, and no new one
        for call in TASKS["corridor-east"].solution.tool_calls:  # type: ignore[union-attr]
            assert (await other.call_tool(call.name, call.arguments)).ok
        assert (await other.verify(row))["reward"] == 1.0
        late = await agent_post("/verify", {**easy, "response": model.transcript.response("")})
        assert late.status_code == 409, late.text  # the trainer's verify: no reward, for any task


# Hosted code that, from its import on, reads every message the server sends its instance, and answers the state the
# task's prompt asks for whatever was played: as an environment that runs the model's code in its own process lets
# that code do.
SNOOPING_ENV = (
    COUNTER_ENV.replace(
        '    @tool(name="stall")',
        '''    @tool(name="what_i_saw")
    async def what_i_saw(self) -> dict[str, Any]:
        """What the messages from the server held."""
        return {"secret": any("the-secret-word" in message for message in SEEN), "messages": len(SEEN)}

    @tool(name="stall")''',
    )
    + """
import dataclasses, json, pickle

SEEN = []
_loads, _dumps = pickle.loads, json.dumps

def _reading(data, *args, **kwargs):
    message = _loads(data, *args, **kwargs)
    SEEN.append(repr(message))
    return message

def _forging(message, *args, **kwargs):  # the state the prompt asks for, whatever was played
    if isinstance(message, tuple) and any(type(part).__name__ == "Observation" for part in message):
        message = tuple(
            dataclasses.replace(part, state={"count": 3}) if type(part).__name__ == "Observation" else part
            for part in message
        )
    return _dumps(message, *args, **kwargs)

pickle.loads, json.dumps = _reading, _forging  # what the server sends, what the instance answers
"""
)


# A tool that lists a file whose name is not UTF-8, as os.listdir gives it: a lone surrogate in its text.
LISTING_ENV = COUNTER_ENV.replace(
    '    @tool(name="stall")',
    '''    @tool(name="list_files")
    async def list_files(self) -> str:
        """The files here."""
        return "caf\\udce9.txt"

    @tool(name="stall")''',
)


@pytest.mark.parametrize("mode", ["process", "in_process"])
async def test_a_tool_reply_text_utf8_cannot_carry_reaches_the_model_escaped(tmp_path: Path, mode: str) -> None:
    """A lone surrogate in a tool's text (a file name os.listdir could not decode) made the reply's encoding fail:
    a 500 in place of the tool's answer. It reaches the model as its escape."""
    bundle = make_bundle(tmp_path)
    (bundle / "env.py").write_text(LISTING_ENV.replace("{TOOL}", "increment"))
    folder = (await awrite_folder(str(bundle), tmp_path / "root", mode=mode)).path
    async with served(folder) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(rows(folder)[0])
        listed = await episode.call_tool("list_files")
        assert (listed.status_code, listed.text) == (200, "caf\\udce9.txt"), listed.text


# A state JSON cannot carry as it is: NaN, and a file name os.listdir could not decode.
ODD_STATE_ENV = COUNTER_ENV.replace(
    'return [DataPart(data={"count": self.count})]',
    'return [DataPart(data={"count": self.count, "ratio": float("nan"), "file": "caf\\udce9.txt"})]',
)


@contextlib.asynccontextmanager
async def pool_view(tmp_path: Path, mode: str, env: str) -> AsyncIterator[tuple[httpx.Response, Any, Path]]:
    """A folder of ``env`` served in ``mode``: ``/agentenv/pool/{index}`` of its first instance, the transport that
    serves it, the folder."""
    bundle = make_bundle(tmp_path)
    (bundle / "env.py").write_text(env.replace("{TOOL}", "increment"))
    folder = (await awrite_folder(str(bundle), tmp_path / "root", mode=mode)).path
    async with served(folder) as transport, httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        index = (await pool_status(BASE, transport))["instances"][0]["index"]
        yield await client.get(f"/agentenv/pool/{index}"), transport, folder


@pytest.mark.parametrize("mode", ["process", "in_process"])
async def test_the_pool_view_shows_a_state_json_cannot_carry(tmp_path: Path, mode: str) -> None:
    """``/agentenv/pool/{index}`` shows an instance's state, hosted code's: one holding NaN or a lone surrogate was a
    500. NaN shows as null (as pydantic writes it), the surrogate as its JSON escape."""
    async with pool_view(tmp_path, mode, ODD_STATE_ENV) as (shown, _, _):
        assert shown.status_code == 200, shown.text
        assert shown.json()["data"] == {"count": 0, "ratio": None, "file": "caf\udce9.txt"}, shown.text


DEEP_STATE_ENV = COUNTER_ENV.replace(
    'return [DataPart(data={"count": self.count})]',
    "nested = []\n        for _ in range(100_000):\n            nested = [nested]\n"
    '        return [DataPart(data={"count": self.count, "nested": nested})]',
)


@pytest.mark.parametrize("mode", ["process", "in_process"])
async def test_the_pool_view_shows_that_a_state_is_nested_too_deeply(tmp_path: Path, mode: str) -> None:
    """A state nested past what the server's encoder (in-process) or the instance's and the server's JSON (process
    mode) can walk is shown as an error of that instance, not as a 500 of the view; the server serves on."""
    async with pool_view(tmp_path, mode, DEEP_STATE_ENV) as (shown, transport, folder):
        assert shown.status_code == 200, shown.text
        assert shown.json()["data"] is None, shown.text[:300]
        assert shown.json()["error"], shown.text[:300]
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(rows(folder)[0])
        assert (await episode.call_tool("increment", {"by": 1})).ok


async def test_hosted_code_never_sees_its_tasks_answers_nor_grades_its_episode(tmp_path: Path) -> None:
    """A process instance is sent its task's seed and what grading reads of it (its state), never the criteria's
    expected values nor the solution; the server grades. Hosted code that reads and rewrites every message between
    its instance and the server learns nothing of the answer, and a forged state does not pass the criteria the
    server checks itself (the final answer's)."""
    secret = "the-secret-word"
    task = {
        **COUNTER_TASK,
        "grading": {
            "criteria": [{"kind": "state", "path": "/count", "equals": 3}, {"kind": "response", "contains": secret}]
        },
        "solution": {"tool_calls": [{"name": "increment", "arguments": {"by": 2}}], "final_text": secret},
    }
    bundle = make_bundle(tmp_path, tasks=[task])
    (bundle / "env.py").write_text(SNOOPING_ENV.replace("{TOOL}", "increment"))
    folder = (await awrite_folder(str(bundle), tmp_path / "root", mode="process")).path
    row = rows(folder)[0]
    async with served(folder) as transport:
        unsolved = EpisodeClient(BASE, transport=transport)
        await unsolved.seed(row)
        saw = json.loads((await unsolved.call_tool("what_i_saw")).text)
        assert saw["messages"] > 0, saw  # it read the seed's messages...
        assert saw["secret"] is False, saw  # ...and nothing of the answer
        graded = await unsolved.verify(row, "no idea")
        assert [c["score"] for c in graded["criteria"]] == [1.0, 0.0], graded  # its state forged, the answer not
        assert graded["reward"] == 0.0, graded
        solved = EpisodeClient(BASE, transport=transport)
        await solved.seed(row)
        assert (await solved.call_tool("increment", {"by": 2})).ok
        assert (await solved.verify(row, "the-secret-word"))["reward"] == 1.0


# Hosted code that sends, in place of each answer, a pickle that would run code where it is read. (Answers that stand
# for more than the server will build are test_channel's, against a peer on a real socket: a real instance is refused
# the same way, through the same reader, only after its pool's start-up limit.)
ESCAPING_ENV = (
    COUNTER_ENV
    + """
import pickle

import gymhost.environments._agentenv._channel as _channel

class _Escape:
    def __reduce__(self):
        return (exec, ("open(ESCAPED, 'w').write('ran in the server')",))

def _escaping(message):
    return pickle.dumps((*message, _Escape()) if isinstance(message, tuple) else message)

_channel._to_server = _escaping
"""
)


async def test_an_instance_cannot_run_code_in_the_server(tmp_path: Path) -> None:
    """The server reads an instance's frames as JSON, data: a pickle naming ``exec`` is a malformed reply, never
    run; the instance is broken, not the server."""
    escaped = tmp_path / "escaped"
    folder = (await awrite_folder(str(make_bundle(tmp_path)), tmp_path / "root", mode="process")).path
    bundles = [path for path in folder.rglob("env.py")]
    assert len(bundles) == 1, bundles  # the written folder's own copy of the bundle, served from now on
    bundles[0].write_text(ESCAPING_ENV.replace("{TOOL}", "increment").replace("ESCAPED", repr(str(escaped))))
    with pytest.raises(StartupError, match=r"a frame that is not a message"):
        async with served(folder, startup_timeout_s=5):  # (a broken instance is tried until this limit)
            pass
    assert not escaped.exists()


def _a_response(text: str) -> dict[str, Any]:
    """A ``response`` field as a model could write one: a Responses object with one assistant message."""
    message = {"type": "message", "id": "m", "role": "assistant", "status": "completed"}
    message["content"] = [{"type": "output_text", "text": text, "annotations": []}]
    fields = {"id": "r", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": False}
    return {"response": {**fields, "output": [message], "tool_choice": "auto", "tools": []}}


async def test_seeds_wait_for_a_lease_visibly_then_answer_503_naming_the_limit(folder: Path) -> None:
    async with served(folder, source={"instances": 1, "max_instances": 1}, lease_timeout_s=1) as transport:
        row = row_for(folder, "corridor-east")
        holder = EpisodeClient(BASE, transport=transport)
        waiters = [EpisodeClient(BASE, transport=transport) for _ in range(2)]
        await holder.seed(row)
        seeding = [asyncio.create_task(waiter.post("/seed_session", row)) for waiter in waiters]
        status = await pool_status(BASE, transport)
        while status["waiting_seeds"] < 2 and not any(task.done() for task in seeding):  # until both wait
            await asyncio.sleep(0.01)
            status = await pool_status(BASE, transport)
        assert (status["waiting_seeds"], status["leased"], status["free"]) == (2, 1, 0)
        assert (status["limits"]["min_instances"], status["limits"]["max_instances"]) == (1, 1)
        assert status["limits"]["lease_timeout_s"] == 1
        for waiter, refused in zip(waiters, await asyncio.gather(*seeding), strict=True):
            assert refused.status_code == 503
            assert refused.json()["failure_kind"] == "provider_unavailable"
            detail = refused.json()["detail"]
            assert "within lease_timeout_s=1s: all 1 instances (the maximum, source.max_instances)" in detail
            assert "--set source.max_instances=N" in detail
            waiter.cookies.update(refused.cookies)
            answer = await verdict(waiter, row)
            assert (answer["mask_sample"], answer["failure_kind"]) == (True, "provider_unavailable")
        assert (await holder.verify(row))["mask_sample"] is False
        status = await pool_status(BASE, transport)
        assert status["waiting_seeds"] == 0
        assert status["counters"]["lease_timeouts"] == 2
        assert (status["counters"]["seeded"], status["counters"]["seed_failed"]) == (1, 2)


async def test_closed_sessions_and_verdicts_are_forgotten_after_remember_s(folder: Path) -> None:
    async with served(folder, remember_s=1) as transport:
        row = row_for(folder, "corridor-east")
        closed, verified = EpisodeClient(BASE, transport=transport), EpisodeClient(BASE, transport=transport)
        await closed.seed(row)
        await closed.post("/close_session", {})
        assert (await closed.post("/seed_session", row)).status_code == 409  # a closed session stays closed
        await verified.seed(row)
        await verified.verify(row)
        assert (await pool_status(BASE, transport))["remembered"] == {"verdicts": 1, "closed": 1}
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (await pool_status(BASE, transport))["remembered"] != {"verdicts": 0, "closed": 0}:
            assert time.monotonic() < deadline, "remembered sessions were never forgotten"
            await asyncio.sleep(0.2)
        late = await verified.post("/verify", {**row, "response": verified.transcript.response("")})
        assert late.status_code == 409
        assert "call /seed_session first" in late.json()["detail"]


async def test_idle_episodes_expire_and_free_their_instance(folder: Path) -> None:
    async with served(folder, source={"instances": 1, "max_instances": 1}, idle_timeout_s=0.5) as transport:
        row = row_for(folder, "corridor-east")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (await pool_status(BASE, transport))["open_episodes"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for task in ("reach-corner", "corridor-east"):  # not started over, with any task (the model idled)
            refused = await episode.post("/seed_session", row_for(folder, task))
            assert refused.status_code == 409, refused.text
            assert "expired; a new episode needs a new session" in refused.json()["detail"], refused.text
        answer = await verdict(episode, row)
        assert (answer["mask_sample"], answer["failure_kind"]) == (True, "session_expired")
        assert (await play(BASE, row, transport=transport))["reward"] == 1.0


async def test_a_second_verify_is_refused_and_repeats_the_first_verdict(folder: Path) -> None:
    async with served(folder) as transport:
        row = row_for(folder, "reach-corner")
        episode = EpisodeClient(BASE, transport=transport)
        never_seeded = await episode.post("/verify", {**row, "response": episode.transcript.response("")})
        assert never_seeded.status_code == 409
        assert "call /seed_session first" in never_seeded.json()["detail"]
        await episode.seed(row)
        await episode.call_tool("gridsim_move", {"direction": "right"})
        await episode.call_tool("gridsim_move", {"direction": "up"})
        first = await episode.verify(row)
        second = await episode.post("/verify", {**row, "response": episode.transcript.response("")})
        assert first["reward"] == 1.0
        assert second.status_code == 409
        assert second.json()["detail"] == "this episode was already verified; its verdict is repeated here"
        assert second.json()["verdict"]["reward"] == 1.0
        shared = set(second.json()["verdict"]) & set(first)
        assert {key: second.json()["verdict"][key] for key in shared} == {key: first[key] for key in shared}
        counters = (await pool_status(BASE, transport))["counters"]
        assert (counters["verified"], counters["masked"]) == (1, 0)


async def test_the_environment_sessions_flow_of_nemo_gym_0_7(folder: Path, gym_version: tuple[int, ...]) -> None:
    """The checks of nemo-gym's check_resources_session_contract, plus an episode played in that flow."""
    if gym_version < (0, 5):
        async with served(folder) as transport:  # 0.4.0 has no such flow: the body is just a row without a task
            answer = await EpisodeClient(BASE, transport=transport).post("/seed_session", {"resources_session_id": "x"})
            assert answer.status_code == 422
        return
    row = row_for(folder, "reach-corner")
    seed = {
        "resources_session_id": "rs-1",
        "episode_id": {"rollout_id": "r1"},
        "task_id": {"taskset": "gridsim", "task_id": "reach-corner"},
        "task_data": {"task_id": "reach-corner", "split": "eval"},
    }
    close = {"resources_session_id": "rs-1", "episode_id": {"rollout_id": "r1"}}
    async with served(folder) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        for _ in range(2):  # seed, then a repeated seed
            answer = await episode.post("/seed_session", seed)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"resources_session_id": "rs-1", "resources_tools": None, "sandbox_access": None}
            episode.cookies.update(answer.cookies)
        other = await episode.post("/seed_session", {**seed, "episode_id": {"rollout_id": "r2"}})
        assert other.status_code == 409
        for call in TASKS["reach-corner"].solution.tool_calls:  # type: ignore[union-attr]
            assert (await episode.call_tool(call.name, call.arguments)).ok
        assert (await episode.verify(row))["reward"] == 1.0
        for _ in range(2):  # close, then a repeated close
            answer = await episode.post("/close_session", close)
            assert (answer.status_code, answer.json()) == (200, {"resources_session_id": "rs-1"})
        never = {**close, "resources_session_id": "rs-never"}
        assert (await episode.post("/close_session", never)).status_code == 200
        for late in (seed, {**seed, "resources_session_id": "rs-never"}):
            assert (await episode.post("/seed_session", late)).status_code >= 400


async def test_the_url_source_against_separately_started_environments(tmp_path: Path) -> None:
    tasks = GRIDSIM / "tasks" / "eval.jsonl"
    with environment_process() as first, environment_process() as second:
        written = (await awrite_folder(first.url, tmp_path, tasks_file=tasks, urls=[second.url])).path
        async with served(written) as transport:
            status = await pool_status(BASE, transport)
            assert [(i["url"], i["pid"]) for i in status["instances"]] == [(first.url, None), (second.url, None)]
            answers = await asyncio.gather(*(play(BASE, row, transport=transport) for row in rows(written)[:4]))
            assert [answer["reward"] for answer in answers] == [1.0] * 4


async def test_startup_refuses_another_environment(folder: Path) -> None:

    app = create_app(folder, environment="mailbox")
    with pytest.raises(StartupError, match=r"the environment is 'gridsim', but this server was written for 'mailbox'"):
        async with app.router.lifespan_context(app):
            pass


async def test_a_second_lifespan_serves_the_tools_the_environment_has_then(tmp_path: Path) -> None:
    """The same app started twice, its env.py edited in between (a tool renamed): the second run routes the new
    tool, answers the old one as unknown, and names the tools it has now."""
    folder = (await awrite_folder(str(make_bundle(tmp_path)), tmp_path / "root")).path
    app = create_app(folder)
    row = rows(folder)[0]
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), EpisodeClient(BASE, transport=transport) as episode:
        await episode.seed(row)
        assert json.loads((await episode.call_tool("stall", {"seconds": 0})).text) == {"count": 1}
    env = folder / "bundle" / "env.py"
    env.write_text(env.read_text().replace('@tool(name="stall")', '@tool(name="pause")'))
    async with app.router.lifespan_context(app), EpisodeClient(BASE, transport=transport) as episode:
        await episode.seed(row)
        assert json.loads((await episode.call_tool("pause", {"seconds": 0})).text) == {"count": 1}
        old = await episode.call_tool("stall", {"seconds": 0})
        detail = "no tool 'stall' here; the tools are: increment, pause"
        assert (old.status_code, json.loads(old.text)) == (404, {"detail": detail})
    paths = [getattr(route, "path", None) for route in app.router.routes]
    assert (paths.count("/pause"), paths.count("/{name}"), "/stall" in paths) == (1, 1, False)


async def test_a_tool_whose_path_a_post_route_of_the_app_takes_is_refused_at_start(tmp_path: Path) -> None:
    from gymhost.environments import CatalogError

    folder = (await awrite_folder(str(make_bundle(tmp_path)), tmp_path / "root")).path
    app = create_app(folder)

    @app.post("/stall")
    async def own_stall() -> dict[str, str]:
        return {"answered": "by the app's own route"}

    with pytest.raises(CatalogError, match=r"tool 'stall' clashes with the app's own POST /stall route"):
        async with app.router.lifespan_context(app):
            pass


def test_no_instance_outlives_the_server(process_folder: Path) -> None:
    """SIGTERM stops every instance; so does SIGKILL, through the instances' death pipe."""
    for stop in (signal.SIGTERM, signal.SIGKILL):
        with serving(gymhost_command("serve", str(process_folder), "--port", "0")) as server:
            pids = [
                i["pid"] for i in httpx.get(f"{server.url}/agentenv/pool", timeout=CALL_TIMEOUT_S).json()["instances"]
            ]
            assert all(alive(pid) for pid in pids)
            server.process.send_signal(stop)
            server.process.wait(20)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in pids), f"instances {pids} outlived the server ({stop.name})"


EARLY = re.compile(r"instance template started before the server is built \(pid (\d+)\)")


async def test_gymhost_serve_starts_a_process_folders_template_before_building_its_app(process_folder: Path) -> None:
    """The template imports the bundle while the server imports nemo-gym (``_early``); the pool adopts it: every
    instance is forked under that very process, and episodes play on them."""
    with serving(gymhost_command("serve", str(process_folder), "--port", "0", "--log-level", "debug")) as server:
        started = EARLY.search(server.output)
        assert started is not None, server.output
        early = int(started.group(1))
        assert f"the instance template started early adopted (pid {early})" in server.output
        answer = await play(server.url, row_for(process_folder, "around-the-wall"))
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False)
        instances = (await settled_pool(server.url))["instances"]
        assert {instance["pid"] for instance in instances} <= set(descendants(early))
        assert "not this pool's" not in server.output
    assert_stopped_cleanly(server)


def test_a_template_started_early_goes_with_a_server_whose_build_fails(process_folder: Path, tmp_path: Path) -> None:
    """A folder whose tasks do not load fails the build after its template started: the template is stopped and its
    folder removed as the server exits, with the build's own error."""
    broken = tmp_path / "resources_servers" / "gridsim_v1"
    shutil.copytree(process_folder, broken)
    (broken / "bundle" / "tasks" / "eval.jsonl").write_text("{not json\n")
    command = gymhost_command("serve", str(broken), "--port", "0", "--log-level", "debug")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = server.communicate(timeout=CALL_TIMEOUT_S)
    assert server.returncode != 0, output
    assert EARLY.search(output) is not None, output
    assert "eval.jsonl" in output
    assert "Traceback" not in output, output  # the build says its error in a line; the template nothing
    nothing_of_it_left(broken, server.pid)


def test_a_template_started_early_goes_with_a_server_stopped_as_it_starts(process_folder: Path) -> None:
    """SIGTERM once the template started, while the server builds its app or soon after: nothing of it is left."""
    command = gymhost_command("serve", str(process_folder), "--port", "0", "--log-level", "debug")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in server.stdout or ()], daemon=True)
    reader.start()
    seen: list[str] = []
    while not seen or not EARLY.search(seen[-1]):
        seen.append(lines.get(timeout=CALL_TIMEOUT_S))
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    reader.join(STATE_TIMEOUT_S)  # to the end of its output, which its template's stderr shares
    while not lines.empty():
        seen.append(lines.get())
    output = "".join(seen)
    # Dead by the signal wherever it landed: a build that swallowed its exception (importlib's module-lock callback
    # did, saying "Exception ignored") or wrapped it in its own error (pydantic did) still ends with it.
    assert server.returncode == -signal.SIGTERM, output
    nothing_of_it_left(process_folder, server.pid)


def nothing_of_it_left(folder: Path, server: int) -> None:
    """No process of the folder's bundle (a template, its sandbox, an instance) and no instances' folder of the
    server."""
    assert_none_naming(str(folder / "bundle"), "processes of the bundle")
    assert list(Path(tempfile.gettempdir()).glob(f"gymhost-instances-{server}-*")) == []


def test_gymhost_check_passes_on_gridsim(folder: Path) -> None:
    """A line per row as it ends (not a terminal: no bar), rows done of all, then the report; --quiet: the report."""
    result = run_to_completion(gymhost_command("check", str(folder)))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    progress, report = lines[: len(TASKS)], lines[len(TASKS) :]
    assert [line.split(" (")[0] for line in progress] == [f"checked {n}/{len(TASKS)}" for n in range(1, 1 + len(TASKS))]
    assert all(line.endswith(" ok") and ", 0 failed)" in line for line in progress), progress
    assert report[0].split() == ["task", "reference", "empty", "result"]
    assert sum(line.endswith("  ok") for line in report) == len(TASKS)
    assert report[-1] == f"all {len(TASKS)} rows pass: every reference solution scores 1.0 and no empty attempt does"
    quiet = run_to_completion(gymhost_command("check", str(folder), "--quiet"))
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert quiet.stdout.splitlines() == report


def test_gymhost_check_fails_a_task_whose_grading_does_not_hold(tmp_path: Path) -> None:
    bundle = Path(shutil.copytree(GRIDSIM, tmp_path / "gridsim_v1"))
    tasks = [json.loads(line) for line in (bundle / "tasks" / "eval.jsonl").read_text().splitlines()]
    tasks[0]["solution"]["tool_calls"] = tasks[0]["solution"]["tool_calls"][:1]  # stops short of the goal
    tasks[1]["grading"]["criteria"] = [{"kind": "state", "path": "/moves", "equals": 0}]  # nothing done passes
    (bundle / "tasks" / "eval.jsonl").write_text("\n".join(json.dumps(t) for t in tasks[:3]) + "\n")
    folder = write_folder(str(bundle), tmp_path / "root").path
    result = run_to_completion(gymhost_command("check", str(folder)))
    assert result.returncode == 1
    named = [line for line in result.stdout.splitlines() if line.startswith("checked ") and " FAIL: " in line]
    assert len(named) == 2, "each failing row is named as it ends"
    assert any("eval:corridor-east FAIL: reference scored 0: /at_goal = false, expected true" in n for n in named)
    assert "eval:corridor-east: reference scored 0: /at_goal = false, expected true" in result.stdout
    assert "eval:reach-corner: reference scored 0" in result.stdout
    assert "eval:reach-corner: an empty attempt scored 1.0" in result.stdout
    assert result.stderr.strip() == "Error: 2 of 3 rows failed the check"


def test_gyms_own_launcher_runs_the_written_app_py(folder: Path) -> None:
    """What `gym env start` does once the folder's venv exists: `python app.py` in the folder, the resolved config
    in NEMO_GYM_CONFIG_DICT. (On nemo-gym 0.4.0 run_webserver also starts a local Ray cluster, and stops it.)"""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.load(folder / "configs" / "gridsim_v1.yaml"))
    assert isinstance(config, dict)
    from .processes import free_port

    port = free_port()
    block = config["gridsim_v1_resources_server"]["resources_servers"]["gridsim_v1"]
    block.update(host="127.0.0.1", port=port)
    global_config = {
        "gridsim_v1_resources_server": config["gridsim_v1_resources_server"],
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "dry_run": False,
    }
    env = {
        "NEMO_GYM_CONFIG_DICT": OmegaConf.to_yaml(OmegaConf.create(global_config)),
        "NEMO_GYM_CONFIG_PATH": "gridsim_v1_resources_server",
    }
    url = f"http://127.0.0.1:{port}"
    with serving([sys.executable, "app.py"], cwd=folder, env=env, url=url):
        answer = await_sync(play(url, row_for(folder, "checkpoint-tour")))
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False)


def await_sync(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def test_a_tool_that_hangs_times_out_masked_and_its_instance_is_replaced(mode: str, tmp_path: Path) -> None:
    """The failure both modes share: an instance that stops answering. In-process instances cannot be killed on
    their own; a tool that outlives tool_timeout_s is how one breaks."""
    from .agentenv_helpers import make_bundle

    written = (await awrite_folder(str(make_bundle(tmp_path)), tmp_path / "root", mode=mode, instances=1)).path
    the_row = rows(written)[0]
    async with served(written, tool_timeout_s=0.5) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(the_row)
        before = (await pool_status(BASE, transport))["instances"][0]
        stalled = await episode.call_tool("stall", {"seconds": 3})
        assert stalled.status_code == 503
        assert "did not answer within 0.5s" in stalled.text
        answer = await verdict(episode, the_row)
        assert (answer["mask_sample"], answer["failure_kind"]) == (True, "transport_timeout")
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(the_row)
        (after,) = (await pool_status(BASE, transport))["instances"]
        assert (after["index"], after["episodes"]) == (before["index"] + 1, 1)  # a new instance took its place
        await episode.call_tool("increment", {"by": 2})
        assert (await episode.verify(the_row))["reward"] == 1.0
        if mode == "process":
            assert after["pid"] != before["pid"]  # a new process replaced the one that stopped answering


async def test_in_process_tool_calls_without_http_answer_what_process_instances_answer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The differential check of the direct path: every gridsim task's reference solution and an empty attempt,
    played on in-process instances (tools called on the server object) and on instance processes (MCP over HTTP):
    the same tool texts, error flags and verdicts."""

    async def transcripts(mode: str) -> list[Any]:
        folder = (await awrite_folder(str(GRIDSIM), tmp_path_factory.mktemp(mode), mode=mode)).path
        played = []
        async with served(folder) as transport:
            for row in rows(folder):
                solution = TASKS[row["task_id"]].solution
                assert solution is not None
                for calls, final in ((solution.tool_calls, solution.final_text), ([], "")):
                    async with EpisodeClient(BASE, transport=transport) as episode:
                        await episode.seed(row)
                        outputs = [await episode.call_tool(call.name, call.arguments) for call in calls]
                        # A wrong move too, for the environment's own error text.
                        outputs.append(await episode.call_tool("gridsim_move", {"direction": "sideways"}))
                        verdict = await episode.verify(row, final)
                    played.append(
                        (
                            row["task_id"],
                            [(output.text, output.ok, output.status_code) for output in outputs],
                            {key: verdict[key] for key in ("reward", "mask_sample", "criteria")},
                        )
                    )
        return played

    in_memory, over_http = await transcripts("in-process"), await transcripts("process")
    assert in_memory == over_http
    assert {verdict["reward"] for _, _, verdict in in_memory} == {0.0, 1.0}
    assert all(not ok for _, outputs, _ in in_memory for _, ok, _ in outputs[-1:])  # the wrong move is an error
