"""The real trainer client: verifiers' `vf-eval` with its NeMo Gym taskset plays rows of a written OpenEnv folder
that `gymhost serve` serves, the way prime-rl runs it (`--env.taskset.task.resources-url URL`).

verifiers pins mcp 2 and nemo-gym needs mcp < 2, so it lives in a venv of its own (`make test` builds
`.venv-verifiers` and names its bin folder in GYMHOST_VERIFIERS_BIN). Its agent program is a uv script whose
dependencies uv installs from the package index on first use (cached in the venv). The model is
`scripted_model.py`: a fixed play, so the reward says what gymhost and the environment made of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .processes import ServerProcess, assert_stopped_cleanly, free_port, gymhost_command, serving
from .test_agent_env import BUNDLE, agent_env_python
from .test_agent_env import rows as agent_env_rows
from .test_agent_env import write as write_agent_env
from .test_openenv import openenv_server, rows, write

pytestmark = [
    pytest.mark.nemo_gym,
    pytest.mark.processes,
    pytest.mark.verifiers,
    pytest.mark.usefixtures("clean_env"),
]

SCRIPTED_MODEL = Path(__file__).with_name("scripted_model.py")


def verifiers_bin() -> Path:
    found = os.environ.get("GYMHOST_VERIFIERS_BIN")
    if not found or not (Path(found) / "vf-eval").is_file():
        pytest.fail("GYMHOST_VERIFIERS_BIN must name the bin folder of a venv with verifiers (make test builds one)")
    return Path(found)


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    with openenv_server() as openenv:
        folder = write(openenv.url, tmp_path_factory.mktemp("openenv"))
        with serving(gymhost_command("serve", str(folder), "--port", "0")) as running:
            yield running, folder
        assert_stopped_cleanly(running)


def vf_eval(gym_url: str, row: dict[str, Any], script: dict[str, Any], work: Path) -> dict[str, Any]:
    """One row through `vf-eval`; the trace it wrote for it (vf-eval exits 0 even when a rollout failed)."""
    bin_folder = verifiers_bin()
    (work / "row.jsonl").write_text(json.dumps(row) + "\n")
    # The taskset's dataset is a required field that vf-eval 0.4.0 cannot take as a flag: a config file holds it.
    (work / "eval.toml").write_text(f'[env.taskset]\nid = "nemo-gym"\ndataset = "{work / "row.jsonl"}"\n')
    port = free_port()
    model = [sys.executable, str(SCRIPTED_MODEL), "--port", str(port), "--script", json.dumps(script)]
    environment = {
        **os.environ,
        "HOME": str(work),  # verifiers and uv keep nothing of this run outside it
        "UV_CACHE_DIR": str(bin_folder.parent / "uv-cache"),  # the agent program's dependencies, once per venv
        "UV_PYTHON": str(bin_folder / "python"),
        "UV_PYTHON_DOWNLOADS": "never",
        "PATH": f"{bin_folder}{os.pathsep}{os.environ['PATH']}",
        "SCRIPTED_API_KEY": "unused",
    }
    command = [
        str(bin_folder / "vf-eval"),
        "@",
        str(work / "eval.toml"),
        "--env.taskset.task.resources-url",
        gym_url,
        "--env.agent.runtime.type",
        "subprocess",  # the default runtime is a hosted sandbox
        "--env.agent.harness.id",
        "null",  # the model gets the server's tools and nothing else
        "-m",
        "scripted",
        "--client.base-url",
        f"http://127.0.0.1:{port}/v1",
        "--client.api-key-var",
        "SCRIPTED_API_KEY",
        "--no-push",
        "--no-rich",
        "-n",
        "1",
        "-o",
        str(work / "out"),
    ]
    with serving(model, url=f"http://127.0.0.1:{port}", ready_path="/v1/models"):
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    traces = list((work / "out").glob("*/traces.jsonl"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(traces) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(traces[0].read_text().splitlines()[0])
    trace: dict[str, Any] = record["traces"][0]
    return trace


@pytest.mark.parametrize(("answer", "reward"), [(7, 1.0), (8, 0.0)])
def test_verifiers_plays_a_row_and_gets_the_environments_reward(
    gym: tuple[ServerProcess, Path], tmp_path: Path, answer: int, reward: float
) -> None:
    server, folder = gym
    row = next(row for row in rows(folder) if row["task_id"] == "test-0")  # hidden numbers 2 and 5
    steps = [{"name": "look", "arguments": {}}, {"name": "submit", "arguments": {"answer": answer}}]
    trace = vf_eval(server.url, row, {"steps": steps, "final": f"The sum is {answer}."}, tmp_path)
    assert (trace["ok"], trace["stop_condition"], trace["errors"]) == (True, "agent_completed", []), trace
    assert trace["rewards"]["nemo_gym"]["score"] == reward


@pytest.fixture(scope="module")
def agent_env_gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    folder = write_agent_env(str(BUNDLE), tmp_path_factory.mktemp("agent-env"), "--python", agent_env_python())
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as running:
        yield running, folder
    assert_stopped_cleanly(running)


@pytest.mark.parametrize(("answer", "reward"), [("Paris.", 1.0), ("Lyon.", 0.0)])
def test_verifiers_plays_an_agent_env_task_answered_in_the_final_message(
    agent_env_gym: tuple[ServerProcess, Path], tmp_path: Path, answer: str, reward: float
) -> None:
    """The model answers in its last message, as chat models trained through verifiers do, and never calls
    end_turn: the verify hands that answer to agent-env, whose verifier grades it."""
    server, folder = agent_env_gym
    row = agent_env_rows(folder)[("all", "capital")]
    trace = vf_eval(server.url, row, {"steps": [], "final": answer}, tmp_path)
    assert (trace["ok"], trace["stop_condition"], trace["errors"]) == (True, "agent_completed", []), trace
    assert trace["rewards"]["nemo_gym"]["score"] == reward
