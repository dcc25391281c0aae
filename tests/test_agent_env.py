"""agent-env (PyPI `agentenv-framework`) as a source: its own OpenEnv server at a URL, and an agent-env bundle folder,
each written as a Gym folder, served and played.

The bundle is `examples/agent_env_quiz`: one-turn and two-turn tasks graded by agent-env's response verifier, tasks
whose turns have tools of their own (an env type of the bundle's that needs no Docker), and a task whose verifier
raises. agent-env runs from its own venv (`make test` builds `.venv-agentenv` and names its Python in
GYMHOST_AGENT_ENV_PYTHON; its dependencies conflict with nemo-gym 0.4.0's). Everything is on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient

from .conftest import REPO
from .processes import (
    CALL_TIMEOUT_S,
    STATE_TIMEOUT_S,
    ServerProcess,
    alive,
    assert_stopped_cleanly,
    children,
    free_port,
    gymhost_command,
    on_a_terminal,
    run_to_completion,
    serving,
)
from .verdicts import verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BUNDLE = REPO / "examples" / "agent_env_quiz"
SERVER = Path(__file__).with_name("agent_env_server.py")
APP_RUNNER = REPO / "src" / "gymhost" / "environments" / "_openenv" / "_agent_env_app.py"  # agent-env's app, as run
TOOLS = {
    "capital": ["end_turn"],
    "count": ["end_turn"],
    "broken": ["end_turn"],
    "sum": ["add", "multiply", "end_turn"],
    "shout": ["shout", "fail", "end_turn"],
}


def agent_env_python() -> str:
    python = os.environ.get("GYMHOST_AGENT_ENV_PYTHON")
    if not python or not Path(python).is_file():
        pytest.fail(
            "GYMHOST_AGENT_ENV_PYTHON must name the Python of a venv with agentenv-framework (make test builds one)"
        )
    return python


def rows(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted((folder / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found[(row["split"], row["task_id"])] = row
    return found


def write(source: str, root: Path, *args: str) -> Path:
    done = run_to_completion(gymhost_command("write", source, str(root), *args), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "resources_servers" / "agent_env_quiz"


def test_write_says_how_far_it_has_read_the_tasks_unless_quiet(tmp_path: Path) -> None:
    """An agent-env bundle's tasks are read by resetting each (their tools live in the episode): a tenth at a time,
    and all of them, said on stderr; --quiet says none of it."""
    command = gymhost_command("write", str(BUNDLE), str(tmp_path / "said"), "--split", "smoke")
    done = run_to_completion(command, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if "tasks read" in line]
    assert said[-1] == "gymhost: agent_env_quiz, split smoke: the resets of 3 of 3 tasks read", done.stderr
    assert [line.rsplit(" of ", 2)[-2].rsplit(" ", 1)[-1] for line in said] == ["1", "2", "3"]
    quiet = run_to_completion([*command[:-3], str(tmp_path / "quiet"), "--split", "smoke", "--quiet"], timeout=180)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "tasks read" not in quiet.stderr
    shown = on_a_terminal([*command[:-3], str(tmp_path / "shown"), "--split", "smoke"], timeout=180)
    assert "agent_env_quiz, split smoke: tasks read" in shown, shown  # a bar, redrawn in place
    assert "\x1b[" in shown, shown
    assert "the resets of" not in shown, "a terminal gets a bar, not log lines"
    assert "gymhost: wrote " in shown


def app_of(server: ServerProcess) -> int:
    """The agent-env app a gymhost server runs: its one child that runs ``_agent_env_app.py``."""
    (app,) = [
        pid for pid in children(server.process.pid) if "_agent_env_app.py" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
    return app


@pytest.fixture(scope="module")
def agent_env_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """agent-env's OpenEnv server for the bundle, started as its users start it."""
    port = free_port()
    state = tmp_path_factory.mktemp("agent-env-state")
    command = [agent_env_python(), str(SERVER), str(BUNDLE), str(port)]
    with serving(command, env={"XDG_STATE_HOME": str(state)}, url=f"http://127.0.0.1:{port}", ready_path="/health"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def from_url(agent_env_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(agent_env_url, tmp_path_factory.mktemp("from-url"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(
        str(BUNDLE), tmp_path_factory.mktemp("from-bundle"), "--python", agent_env_python(), "--instances", "4"
    )


@pytest.fixture(scope="module")
def inherited() -> Iterator[int]:
    """A descriptor the module's server inherits from whoever started it, as from a shell: a pipe's read end."""
    read, write = os.pipe()
    yield read
    os.close(read)
    os.close(write)


@pytest.fixture(scope="module")
def gym(folder: Path, inherited: int) -> Iterator[ServerProcess]:
    with serving(gymhost_command("serve", str(folder), "--port", "0"), pass_fds=[inherited]) as running:
        app = app_of(running)
        yield running
    assert_stopped_cleanly(running)
    assert not alive(app), "agent-env's app outlived the server"


def link_of(pid: int, fd: int) -> str:
    """What ``pid``'s ``fd`` is (``pipe:[INODE]``, a path), or "" if it closed meanwhile."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


def test_agent_envs_app_holds_nothing_the_server_inherited(gym: ServerProcess, inherited: int) -> None:
    """The server passes its inheritable descriptors on to what it starts (uvloop does, whatever ``close_fds``
    says): agent-env's app closes them before it imports anything of the bundle's."""
    held = link_of(gym.process.pid, inherited)
    assert held == f"pipe:[{os.fstat(inherited).st_ino}]", "the server holds it: what the app must not"
    app = app_of(gym)
    assert held not in {link_of(app, int(fd)) for fd in os.listdir(f"/proc/{app}/fd")}


async def play(
    base: str, row: dict[str, Any], calls: list[tuple[str, dict[str, Any]]], final: str
) -> tuple[list[httpx.Response | Any], dict[str, Any]]:
    """Seed, the tool calls (their outputs), then verify with ``final`` as the last assistant message."""
    async with EpisodeClient(base) as episode:
        await episode.seed(row)
        outputs = [await episode.call_tool(name, arguments) for name, arguments in calls]
        return outputs, await verdict(episode, row, final)


def test_write_from_agent_envs_server_needs_nothing_but_its_url(from_url: Path) -> None:
    """Names as ids, the tasks' system prompts in the rows, each row with the tools its task's turn has (agent-env
    lists tools only inside an episode), and end_turn named as the tool a verify ends an open turn with."""
    written = rows(from_url)
    assert {task for _, task in written} == set(TOOLS)
    assert {split for split, _ in written} == {"all", "smoke"}
    for (_, task), row in written.items():
        assert [tool["name"] for tool in row["responses_create_params"]["tools"]] == TOOLS[task], task
    capital = written[("all", "capital")]["responses_create_params"]["input"]
    assert capital == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What is the capital of France? Answer with one word."},
    ]
    config = (from_url / "configs" / "agent_env_quiz.yaml").read_text()
    assert "kind: openenv" in config
    assert 'reply_tool: "end_turn"' in config


def test_write_from_the_bundle_folder_runs_agent_envs_app_itself(folder: Path, from_url: Path) -> None:
    """The same rows as from the server, the bundle copied in under its own name, and the interpreter that runs
    agent-env's app named in the config."""
    assert rows(folder) == rows(from_url)
    config = (folder / "configs" / "agent_env_quiz.yaml").read_text()
    assert "kind: agent_env" in config
    assert f'python: "{agent_env_python()}"' in config
    assert (folder / "bundle" / "agent_env_quiz" / "tasks" / "capital.json").is_file()
    assert (folder / "bundle" / "agent_env_quiz" / ".agentenv" / "config.toml").is_file()
    requirements = (folder / "requirements.txt").read_text().splitlines()
    assert not [
        line for line in requirements if line.startswith(("agentenv-framework[", "agentenv-framework=", "openenv"))
    ], "agent-env is its app's venv's, not the server's"


async def test_a_right_reply_scores_through_end_turn_or_as_the_final_answer(gym: ServerProcess, folder: Path) -> None:
    row = rows(folder)[("all", "capital")]
    through_tool, answer = await play(gym.url, row, [("end_turn", {"response": "Paris"})], "Paris")
    assert through_tool[0].ok
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
    _, answer = await play(gym.url, row, [], "Paris.")  # a model that answers in its last message
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
    _, answer = await play(gym.url, row, [], "London")
    assert (answer["reward"], answer["mask_sample"]) == (0.0, False), answer
    # A model that called end_turn itself is scored on what it passed, whatever it says after.
    _, answer = await play(gym.url, row, [("end_turn", {"response": "London"})], "Paris")
    assert (answer["reward"], answer["mask_sample"]) == (0.0, False), answer


async def test_a_multi_turn_task_goes_on_to_its_next_turn(gym: ServerProcess, folder: Path) -> None:
    """end_turn answers the next turn's prompt; the last turn's reply is graded. A model that never reaches the
    second turn (it verifies after the first) has the second ended with no reply: its failure, a genuine 0."""
    row = rows(folder)[("smoke", "count")]
    outputs, answer = await play(gym.url, row, [("end_turn", {"response": "4"})], "8")
    assert (outputs[0].status_code, outputs[0].text) == (200, "Now reply with that number doubled.")
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
    _, answer = await play(gym.url, row, [], "4")
    assert (answer["reward"], answer["mask_sample"]) == (0.0, False), answer


async def test_each_task_has_the_tools_of_its_own_turn(gym: ServerProcess, folder: Path) -> None:
    """The server routes every task's tools; a tool of another task reaches agent-env, which answers it as the
    model's error; a tool no task has is gymhost's 404."""
    everything = rows(folder)
    outputs, answer = await play(
        gym.url,
        everything[("all", "sum")],
        [("add", {"a": 17, "b": 25}), ("shout", {"text": "hi"}), ("add", {"a": "x", "b": 1})],
        "It is 42.",
    )
    assert (outputs[0].status_code, outputs[0].text) == (200, "42")
    assert outputs[1].status_code == 400
    assert "offers no tool 'shout'; it offers ['add', 'multiply']" in outputs[1].text
    assert outputs[2].status_code == 400
    assert "validation error" in outputs[2].text
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
    outputs, answer = await play(gym.url, everything[("all", "shout")], [("fail", {"reason": "on purpose"})], "")
    assert (outputs[0].status_code, outputs[0].text) == (400, "Error executing tool fail: on purpose")
    assert (answer["reward"], answer["mask_sample"]) == (0.0, False), answer
    async with EpisodeClient(gym.url) as episode:
        await episode.seed(everything[("all", "capital")])
        missing = await episode.call_tool("teleport", {})
    assert missing.status_code == 404
    assert "end_turn" in missing.text


async def test_an_episode_agent_env_could_not_run_is_masked_never_scored(gym: ServerProcess, folder: Path) -> None:
    """The task's verifier raises: agent-env ends the episode with an error observation and no reward. Its verify is
    masked with agent-env's error (a refusal on nemo-gym 0.4.0), whether the model called end_turn or not, and the
    metrics count it by kind."""
    row = rows(folder)[("all", "broken")]
    for calls in ([], [("end_turn", {"response": "Hello."})]):
        outputs, answer = await play(gym.url, row, calls, "Hello.")  # type: ignore[arg-type]
        assert (answer["reward"], answer["mask_sample"]) == (0.0, True), answer
        assert answer["failure_kind"] == "openenv:environment_error", answer
        assert "criterion #0 has unknown type 'response_is_polite'" in answer["failure_reason"], answer
        if calls:  # the model's own end_turn met the failure: the call is refused, the episode masked
            assert outputs[0].status_code == 503, outputs[0].text
    metrics = httpx.get(f"{gym.url}/metrics", timeout=CALL_TIMEOUT_S).text
    assert 'gymhost_episodes_ended_total{failure_kind="openenv:environment_error",mount="/",outcome="masked"} 2.0' in (
        metrics
    ), metrics


def test_check_says_plainly_what_it_checked(tmp_path: Path) -> None:
    """agent-env's tasks carry no reference solution: without solutions nothing but empty attempts is checked, and
    check says so and fails unless told to accept that; with a solutions file every row is checked."""
    smoke = write(str(BUNDLE), tmp_path, "--split", "smoke")  # the Python from GYMHOST_AGENT_ENV_PYTHON
    done = run_to_completion(gymhost_command("check", str(smoke)), timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nothing was checked: no task has a reference solution" in done.stdout, done.stdout
    assert "none of the 3 rows has a reference solution" in done.stderr, done.stderr
    done = run_to_completion(gymhost_command("check", str(smoke), "--allow-unchecked"), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    solutions = tmp_path / "solutions.jsonl"
    solutions.write_text(
        "\n".join(
            json.dumps(solution)
            for solution in [
                {"task_id": "capital", "final_text": "Paris"},
                {
                    "task_id": "count",
                    "tool_calls": [{"name": "end_turn", "arguments": {"response": "4"}}],
                    "final_text": "8",
                },
                {
                    "task_id": "sum",
                    "tool_calls": [{"name": "add", "arguments": {"a": 17, "b": 25}}],
                    "final_text": "42",
                },
            ]
        )
    )
    done = run_to_completion(gymhost_command("check", str(smoke), "--solutions", str(solutions)), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 3 rows pass" in done.stdout, done.stdout


async def test_agent_envs_app_killed_mid_episode_costs_that_episode_only(folder: Path) -> None:
    """SIGKILL of agent-env's app while an episode is open: the episode is masked, never scored; the server starts
    the app again and the next episode plays. SIGKILL of the server: the app does not outlive it, and leaves no
    folder behind. (A server of its own, on the module's folder: writing one costs an app's start.)"""
    row = rows(folder)[("all", "capital")]
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as gym:
        app = app_of(gym)
        async with EpisodeClient(gym.url) as episode:
            await episode.seed(row)
            os.kill(app, signal.SIGKILL)
            cut = await episode.call_tool("end_turn", {"response": "Paris"})
            assert cut.status_code == 503, cut.text
            answer = await verdict(episode, row, "Paris")
        assert answer["mask_sample"] is True, answer
        assert answer["failure_kind"] in {"transport_peer_drop", "transport_unreachable"}, answer
        deadline = time.monotonic() + 60
        while True:  # the app again, once the pool has noticed (a seed meanwhile waits for it)
            _, again = await play(gym.url, row, [], "Paris")
            if not again["mask_sample"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert (again["reward"], again["mask_sample"]) == (1.0, False), again
        app = app_of(gym)
        socket = Path(Path(f"/proc/{app}/cmdline").read_text().split("\0")[3])  # runner BUNDLE SOCKET SESSIONS
        assert socket.exists()
        os.kill(gym.process.pid, signal.SIGKILL)  # the server alone: its process group holds the app too
        gym.process.wait(10)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while alive(app) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not alive(app), "agent-env's app outlived the server that started it"
        assert not socket.parent.exists(), "the app's folder was left behind"


def test_agent_envs_app_imports_agent_env_without_gradio_and_a_bundle_still_finds_it() -> None:
    """OpenEnv's server package imports gradio for a web interface that agent-env's app (on a Unix socket, with no
    ENABLE_WEB_INTERFACE) never mounts: the app imports agent-env as if gradio were not installed (2.6 of the 4.6 s
    that import took), and a bundle's own ``import gradio`` afterwards finds it as installed."""
    script = (
        "import runpy, sys\n"
        f"app = runpy.run_path({str(APP_RUNNER)!r}, run_name='agent_env_app')\n"
        "with app['_without_gradio']():\n"
        "    from agent_env.openenv import build_app\n"
        "import openenv.core.env_server as server\n"
        "print('gradio' in sys.modules, server.create_web_interface_app is None)\n"
        "import gradio\n"
        "print(gradio.Blocks.__name__)\n"
    )
    done = run_to_completion([agent_env_python(), "-c", script], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["False True", "Blocks"], done.stdout


def test_agent_envs_app_says_a_client_that_left_in_one_line() -> None:
    """agent-env's framework logs a traceback when a request's client leaves before its body is read (its own
    client, when a session closes mid-call): the app says it in one warning line, and a real error keeps its
    traceback."""
    script = (
        "import logging, runpy\n"
        "from starlette.requests import ClientDisconnect\n"
        f"runpy.run_path({str(APP_RUNNER)!r}, run_name='agent_env_app')['_configure_logging']()\n"
        "logger = logging.getLogger('agentenv_protocol.a2a_agent.framework')\n"
        "for error in (ClientDisconnect(), RuntimeError('broken')):\n"
        "    try:\n"
        "        raise error\n"
        "    except Exception:\n"
        "        logger.exception('extension request resolution failed (correlation_id=%s)', 'c1')\n"
    )
    done = run_to_completion([agent_env_python(), "-c", script], timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == (
        "agent-env: WARNING agentenv_protocol.a2a_agent.framework: extension request resolution failed "
        "(correlation_id=c1): the request's client left before its body was read"
    ), done.stderr
    assert lines[1].startswith("agent-env: ERROR"), done.stderr
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert "RuntimeError: broken" in done.stderr, done.stderr


def test_strict_refuses_agent_envs_app_which_nothing_confines(folder: Path) -> None:
    """agent-env's app runs unconfined (docs/security.md): under ``--sandbox strict``, confined or no start, its
    folder is not served, and the error says why."""
    done = run_to_completion(gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict"))
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: --sandbox strict: agent-env's app, which runs a written agent_env folder, is not confined"
    ), done.stderr
