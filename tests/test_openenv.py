"""OpenEnv servers as Gym resources servers: `gymhost write URL ROOT` against a real OpenEnv server, then the written
folder served and played.

The OpenEnv server is `examples/openenv_sums/server.py`, a real `openenv` 0.10.0 app under uvicorn in its own venv
(`make test` builds `.venv-openenv` and names its Python in GYMHOST_OPENENV_PYTHON; openenv's dependencies conflict
with nemo-gym 0.4.0's, so it never shares a venv with gymhost). Everything is on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient

from .agentenv_helpers import pool_status_of
from .conftest import REPO
from .processes import ServerProcess, assert_stopped_cleanly, free_port, gymhost_command, run_to_completion, serving
from .verdicts import verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

SUMS = REPO / "examples" / "openenv_sums" / "server.py"
ANSWERS = {"train-0": 6, "train-1": 30, "train-2": 16, "test-0": 7, "test-1": 24, "test-2": 99}


def openenv_python() -> str:
    python = os.environ.get("GYMHOST_OPENENV_PYTHON")
    if not python or not Path(python).is_file():
        pytest.fail("GYMHOST_OPENENV_PYTHON must name the Python of a venv with openenv (make test builds one)")
    return python


def openenv_server(*, sessions: int = 1, port: int | None = None, no_tasks: bool = False) -> Any:
    port = port or free_port()
    command = [openenv_python(), str(SUMS), "--port", str(port), "--max-sessions", str(sessions)]
    return serving(command + (["--no-tasks"] if no_tasks else []), url=f"http://127.0.0.1:{port}", ready_path="/health")


def write(url: str, root: Path, *args: str) -> Path:
    done = run_to_completion(gymhost_command("write", url, str(root), *args))
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "resources_servers" / "sums"


def rows(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in sorted((folder / "data").glob("*.jsonl")) for line in path.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def openenv() -> Iterator[ServerProcess]:
    with openenv_server(sessions=1) as running:
        yield running


@pytest.fixture(scope="module")
def folder(openenv: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(openenv.url, tmp_path_factory.mktemp("openenv"))


@pytest.fixture(scope="module")
def gym(folder: Path) -> Iterator[ServerProcess]:
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as running:
        yield running
    assert_stopped_cleanly(running)


async def play(base: str, row: dict[str, Any], *, right: bool = True) -> dict[str, Any]:
    """The reference play (look, then submit the sum), or an empty attempt (no tool call)."""
    async with EpisodeClient(base) as episode:
        await episode.seed(row)
        if right:
            assert (await episode.call_tool("look")).ok
            assert (await episode.call_tool("submit", {"answer": ANSWERS[row["task_id"]]})).text == "correct"
        return await episode.verify(row)


def test_write_needs_nothing_but_the_url(folder: Path) -> None:
    """Every split's tasks from the Task API, the prompt from the task, the tools from list_tools as Responses
    function tools, and the sessions the server allows (OpenEnv's default: one)."""
    written = rows(folder)
    assert sorted(row["task_id"] for row in written) == sorted(ANSWERS)
    assert {row["split"] for row in written} == {"train", "test"}
    first = written[0]["responses_create_params"]
    assert "submit(answer)" in first["input"][0]["content"]
    assert [tool["name"] for tool in first["tools"]] == ["look", "peek", "submit"]
    assert first["tools"][1]["parameters"]["properties"] == {"position": {"type": "integer"}}
    task = json.loads((folder / "tasks" / "test.jsonl").read_text().splitlines()[1])
    assert task["seed"] == {"reset": {"split": "test", "index": 1}}
    assert task["grading"] == {"criteria": [{"kind": "environment"}]}
    config = (folder / "configs" / "sums.yaml").read_text()
    assert "kind: openenv" in config
    assert "max_instances: 1" in config


def test_check_plays_the_tasks_reference_solutions(folder: Path) -> None:
    done = run_to_completion(gymhost_command("check", str(folder)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 6 rows pass" in done.stdout


async def test_every_row_scores_what_the_environment_says(gym: ServerProcess, folder: Path) -> None:
    for row in rows(folder):
        right = await play(gym.url, row)
        assert (right["reward"], right["mask_sample"]) == (1.0, False), right
        assert right["criteria"][0]["kind"] == "environment"
        empty = await play(gym.url, row, right=False)
        assert (empty["reward"], empty["mask_sample"]) == (0.0, False), empty


async def test_the_environments_errors_reach_the_model_as_text(gym: ServerProcess, folder: Path) -> None:
    row = next(row for row in rows(folder) if row["task_id"] == "test-1")
    async with EpisodeClient(gym.url) as episode:
        await episode.seed(row)
        out_of_range = await episode.call_tool("peek", {"position": 7})
        assert (out_of_range.status_code, out_of_range.text) == (
            400,
            "Error calling tool 'peek': position 7 is out of range 0..2",
        )
        not_a_number = await episode.call_tool("peek", {"position": "seven"})
        assert not_a_number.status_code == 400
        assert "valid integer" in not_a_number.text
        assert (await episode.call_tool("peek", {"position": 2})).text == "9"
        assert (await episode.call_tool("submit", {"answer": 24})).text == "correct"
        late = await episode.call_tool("look")
        assert late.status_code == 400
        assert "the environment said done" in late.text
        answer = await episode.verify(row)
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
    assert "over 4 step(s); it said done" in answer["criteria"][0]["detail"]


async def test_one_session_at_a_time_queues_the_episodes(gym: ServerProcess, folder: Path) -> None:
    """The server allows one session (openenv's default) and the folder says so: eight episodes at once take
    turns, and each scores what it earned."""
    everything = rows(folder)
    answers = await asyncio.gather(*(play(gym.url, everything[i % 6], right=i % 2 == 0) for i in range(8)))
    assert [(a["reward"], a["mask_sample"]) for a in answers] == [(1.0, False), (0.0, False)] * 4, answers
    assert pool_status_of(gym.url)["counters"]["instances_started"] == 1


async def test_more_sessions_than_the_server_allows_are_retried_then_masked(folder: Path) -> None:
    """A folder that asks for more sessions than the server has: a seed refused for capacity waits for a session as
    it waits for an instance, up to lease_timeout_s (the default's 30 s: all of them play, however busy the machine),
    and one refused for longer is a masked provider_unavailable, never a 0.0."""
    two = ["--set", "source.max_instances=2"]
    with serving(gymhost_command("serve", str(folder), "--port", "0", *two)) as gym:
        everything = rows(folder)
        answers = await asyncio.gather(*(play(gym.url, everything[i % 6]) for i in range(6)))
        assert all((a["reward"], a["mask_sample"]) == (1.0, False) for a in answers), answers
    assert_stopped_cleanly(gym)
    # a seed that waits longer than lease_timeout_s: short here, so the test does not wait the default's 30 s
    with serving(gymhost_command("serve", str(folder), "--port", "0", *two, "--set", "lease_timeout_s=1")) as gym:
        async with EpisodeClient(gym.url) as holding, EpisodeClient(gym.url) as refused:
            await holding.seed(everything[0])  # holds the server's one session
            with pytest.raises(httpx.HTTPStatusError) as seed:
                await refused.seed(everything[1])
            answer = seed.value.response
            assert answer.status_code == 503
            assert answer.json()["failure_kind"] == "provider_unavailable"
            assert "max_concurrent_envs" in answer.json()["detail"]
            assert (await holding.call_tool("look")).ok
            assert (await holding.verify(everything[0]))["mask_sample"] is False
    assert_stopped_cleanly(gym)


async def test_an_openenv_server_killed_mid_episode_masks_its_episodes(tmp_path: Path) -> None:
    """SIGKILL of the OpenEnv server while an episode is open: its tool call is refused and its verify masked;
    when the server is back, the next episode plays."""
    port = free_port()
    with openenv_server(port=port) as openenv:
        folder = write(openenv.url, tmp_path)
        row = rows(folder)[0]
        with serving(gymhost_command("serve", str(folder), "--port", "0")) as gym:
            async with EpisodeClient(gym.url) as episode:
                await episode.seed(row)
                assert (await episode.call_tool("look")).ok
                os.killpg(openenv.process.pid, signal.SIGKILL)
                openenv.process.wait(10)
                cut = await episode.call_tool("submit", {"answer": ANSWERS[row["task_id"]]})
                assert cut.status_code == 503, cut
                assert "the environment is unavailable" in cut.text
                answer = await verdict(episode, row)
            assert answer["mask_sample"] is True, answer
            assert answer["failure_kind"] == "transport_peer_drop", answer
            with openenv_server(port=port):
                again = await play(gym.url, row)
            assert (again["reward"], again["mask_sample"]) == (1.0, False), again
        assert_stopped_cleanly(gym)


def test_write_says_what_is_wrong(tmp_path: Path) -> None:
    """No Task API, a prompt field that is not there, nothing listening: one line that says which."""
    with openenv_server(no_tasks=True) as openenv:
        done = run_to_completion(gymhost_command("write", openenv.url, str(tmp_path)))
        assert done.returncode != 0
        assert "has no tasks of its own (its Task API answers 501)" in done.stderr, done.stderr
    with openenv_server() as openenv:
        done = run_to_completion(gymhost_command("write", openenv.url, str(tmp_path), "--prompt-field", "/question"))
        assert done.returncode != 0
        assert "no prompt at the task's /question, the reset's /observation/question" in done.stderr, done.stderr
    done = run_to_completion(gymhost_command("write", f"http://127.0.0.1:{free_port()}", str(tmp_path)))
    assert done.returncode != 0
    assert "nothing answered" in done.stderr, done.stderr
    port = free_port()
    web = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    with serving(web, url=f"http://127.0.0.1:{port}") as other:  # an HTTP server, but not an OpenEnv one
        done = run_to_completion(gymhost_command("write", other.url, str(tmp_path)))
        assert done.returncode != 0
        assert "not an OpenEnv server" in done.stderr, done.stderr
    assert not (tmp_path / "resources_servers").exists() or not any((tmp_path / "resources_servers").iterdir())
