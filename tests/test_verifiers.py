"""The real trainer client: verifiers' `vf-eval` with its NeMo Gym taskset plays rows of servers that `gymhost serve`
serves, the way prime-rl runs it (`--env.taskset.task.resources-url URL`), on both nemo-gym versions.

verifiers returns the `reward` of any 2xx `/verify` and never reads `mask_sample`; a non-2xx `/verify` fails the
rollout (`ok` false in `traces.jsonl`), which keeps it out of training. So every way an episode is lost must come out
as a failed rollout here, never as `ok` with a reward: an environment that failed (agent-env's verifier raising, in a
bundle and behind agent-env's own OpenEnv server), an instance killed mid-episode, a session lost to a restarted
server, an expired session, a drain that timed out, and a Gym server's own masked verdict (its judge unreachable).
The right and wrong plays still score 1.0 and 0.0.

verifiers pins mcp 2 and nemo-gym needs mcp < 2, so it lives in a venv of its own (`make test` builds
`.venv-verifiers` and names its bin folder in GYMHOST_VERIFIERS_BIN). Its agent program is a uv script whose
dependencies uv installs from the package index on first use (cached in the venv). The model is
`scripted_model.py`: a fixed play, so the reward says what gymhost and the environment made of it; where a test acts
in the middle of an episode, the model waits at a gate until it has.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .agentenv_helpers import GRIDSIM, reach_corner
from .processes import CALL_TIMEOUT_S, ServerProcess, alive, assert_stopped_cleanly, free_port, gymhost_command, serving
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
REFUSED = ("410", "502", "503")  # how gymhost refuses a masked verdict (middleware.masked_verdicts)


def verifiers_bin() -> Path:
    found = os.environ.get("GYMHOST_VERIFIERS_BIN")
    if not found or not (Path(found) / "vf-eval").is_file():
        pytest.fail("GYMHOST_VERIFIERS_BIN must name the bin folder of a venv with verifiers (make test builds one)")
    return Path(found)


@dataclass
class Evaluation:
    """A `vf-eval` run in progress; its model may wait at gates (`scripted_model.py`)."""

    process: subprocess.Popen[str]
    work: Path

    @property
    def gates(self) -> Path:
        return self.work / "gates"

    def at_gate(self, name: str, timeout: float = 180) -> None:
        """Wait until the episode has reached the gate: its model holds the turn there."""
        deadline = time.monotonic() + timeout
        while not (self.gates / f"{name}.reached").exists():
            if self.process.poll() is not None:
                raise AssertionError(f"vf-eval ended before gate {name}:\n{self.output()}")
            assert time.monotonic() < deadline, f"the episode did not reach gate {name} in {timeout:g}s"
            time.sleep(0.05)

    def release(self, name: str) -> None:
        (self.gates / f"{name}.go").touch()

    def traces(self) -> list[dict[str, Any]]:
        """The trace of each row, in the rows' order, once it has ended (vf-eval exits 0 even when a rollout
        failed)."""
        self.process.wait(300)
        assert self.process.returncode == 0, self.output()
        found = list((self.work / "out").glob("*/traces.jsonl"))
        assert len(found) == 1, self.output()
        traces = [trace for line in found[0].read_text().splitlines() for trace in json.loads(line)["traces"]]
        return sorted(traces, key=lambda trace: int(trace["task"]["data"]["idx"]))

    def output(self) -> str:
        return (self.work / "vf-eval.log").read_text()[-4000:]


@contextmanager
def evaluating(
    gym_url: str, rows: list[dict[str, Any]], script: dict[str, Any], work: Path, token: str | None = None
) -> Iterator[Evaluation]:
    """`rows` through `vf-eval`, as prime-rl plays them, with the scripted model playing `script`; with a token, as
    the taskset's `headers` send it."""
    bin_folder = verifiers_bin()
    (work / "gates").mkdir(parents=True)
    (work / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # The taskset's dataset is a required field that vf-eval 0.4.0 cannot take as a flag: a config file holds it.
    config = f'[env.taskset]\nid = "nemo-gym"\ndataset = "{work / "rows.jsonl"}"\n'
    if token is not None:
        config += f'[env.taskset.task]\nheaders = {{Authorization = "Bearer {token}"}}\n'
    (work / "eval.toml").write_text(config)
    port = free_port()
    model = [sys.executable, str(SCRIPTED_MODEL), "--port", str(port), "--script", json.dumps(script)]
    model += ["--gates", str(work / "gates")]
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
        str(len(rows)),
        "-o",
        str(work / "out"),
    ]
    with serving(model, url=f"http://127.0.0.1:{port}", ready_path="/v1/models"):
        with (work / "vf-eval.log").open("w") as log:
            process = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield Evaluation(process, work)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def vf_eval(gym_url: str, row: dict[str, Any], script: dict[str, Any], work: Path) -> dict[str, Any]:
    """One row through `vf-eval`; the trace it wrote for it."""
    with evaluating(gym_url, [row], script, work) as evaluation:
        (trace,) = evaluation.traces()
    return trace


def assert_scored(trace: dict[str, Any], reward: float) -> None:
    assert (trace["ok"], trace["stop_condition"], trace["errors"]) == (True, "agent_completed", []), trace
    assert trace["rewards"]["nemo_gym"]["score"] == reward, trace


def assert_failed_unscored(trace: dict[str, Any], *statuses: str) -> None:
    """A failed rollout, which verifiers keeps out of training: its verify was refused with one of ``statuses``."""
    assert trace["ok"] is False, f"a lost episode came back as a scored rollout: {trace}"
    assert trace["rewards"]["nemo_gym"] is None, trace
    (error,) = trace["errors"]
    assert error["type"] == "TaskError", trace
    assert "/verify" in error["message"], trace
    assert any(f"'{status} " in error["message"] for status in statuses), trace


# -- the plays that must score ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    with openenv_server() as openenv:
        folder = write(openenv.url, tmp_path_factory.mktemp("openenv"))
        with serving(gymhost_command("serve", str(folder), "--port", "0")) as running:
            yield running, folder
        assert_stopped_cleanly(running)


def test_verifiers_plays_an_openenv_row_and_gets_the_environments_reward(
    gym: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    server, folder = gym
    row = next(row for row in rows(folder) if row["task_id"] == "test-0")  # hidden numbers 2 and 5
    steps = [{"name": "look", "arguments": {}}, {"name": "submit", "arguments": {"answer": 7}}]
    assert_scored(vf_eval(server.url, row, {"steps": steps, "final": "The sum is 7."}, tmp_path), 1.0)


@pytest.fixture(scope="module")
def agent_env_gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    folder = write_agent_env(str(BUNDLE), tmp_path_factory.mktemp("agent-env"), "--python", agent_env_python())
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as running:
        yield running, folder
    assert_stopped_cleanly(running)


def test_verifiers_scores_agent_env_answers_and_never_an_episode_agent_env_could_not_run(
    agent_env_gym: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    """Three rows in one run. The model answers in its last message, as chat models trained through verifiers do,
    and never calls end_turn: the verify hands that answer to agent-env, whose verifier grades it, right (1.0) or
    wrong (0.0). The third task's verifier raises inside agent-env, which ends its episode with an error observation:
    a failed rollout, never a 0.0."""
    server, folder = agent_env_gym
    found = {task: row for (_, task), row in agent_env_rows(folder).items()}
    scripts = [
        {"match": "capital of France", "final": "Paris."},
        {"match": "17 + 25", "final": "41."},
        {"match": "Say anything", "final": "Hello."},
    ]
    played = [found[task] for task in ("capital", "sum", "broken")]
    with evaluating(server.url, played, {"scripts": scripts}, tmp_path) as evaluation:
        right, wrong, broken = evaluation.traces()
    assert_scored(right, 1.0)
    assert_scored(wrong, 0.0)
    assert_failed_unscored(broken, "502")
    assert refused(server.url, "openenv:environment_error") == 1


# -- every way an episode is lost: a failed rollout ---------------------------------------------------------------


@pytest.fixture
def gridsim(tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The gridsim bundle written as a Gym folder (instances as processes); its reach-corner row and a script that
    plays its reference solution, holding the final turn at the gate `lost` until the test has done its part."""
    from gymhost.environments import write_folder

    folder = write_folder(str(GRIDSIM), tmp_path / "root").path
    row, steps = reach_corner(folder)
    return folder, row, {"steps": steps, "final": "I am at (1, 1).", "gates": {str(len(steps)): "lost"}}


def test_an_instance_killed_mid_episode_is_a_failed_rollout(
    gridsim: tuple[Path, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    folder, row, script = gridsim
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as server:
        with evaluating(server.url, [row], script, tmp_path / "eval") as evaluation:
            evaluation.at_gate("lost")
            (leased,) = [i for i in pool(server.url)["instances"] if i["state"] == "leased"]
            os.kill(leased["pid"], signal.SIGKILL)
            wait_until(lambda: not alive(leased["pid"]), "the instance gone")
            evaluation.release("lost")
            (trace,) = evaluation.traces()
        assert_failed_unscored(trace, "502")
        assert refused(server.url) == 1


@contextmanager
def restarted(command: list[str], evaluation_work: Path, row: dict[str, Any], script: dict[str, Any], stop: Any) -> Any:
    """The episode played against a server at a fixed address, ``stop`` applied to that server once the episode is
    at its gate, and the same server started again there (same address, same GYMHOST_SECRET), as an operator or a
    rolling restart would: yields the evaluation and the new server, with the episode still at its gate."""
    secret = {"GYMHOST_SECRET": "restarts-keep-this"}
    with ExitStack() as first:
        server = first.enter_context(serving(command, env=secret))
        with evaluating(server.url, [row], script, evaluation_work) as evaluation:
            evaluation.at_gate("lost")
            stop(server)
            first.close()
            with serving(command, env=secret) as again:
                yield evaluation, server, again


def test_a_session_lost_to_a_restarted_server_is_a_failed_rollout(
    gridsim: tuple[Path, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """The server dies (SIGKILL) mid-episode and is started again at the same address with the same GYMHOST_SECRET:
    the episode's cookie is still valid, but its episode is gone with the process."""
    folder, row, script = gridsim
    command = gymhost_command("serve", str(folder), "--port", str(free_port()))

    def crash(server: ServerProcess) -> None:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(10)

    with restarted(command, tmp_path / "eval", row, script, crash) as (evaluation, _, again):
        evaluation.release("lost")
        (trace,) = evaluation.traces()
        assert refused(again.url, "session_lost") == 1
    assert_failed_unscored(trace, "410")


def test_an_expired_session_is_a_failed_rollout(
    gridsim: tuple[Path, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    folder, row, script = gridsim
    command = gymhost_command("serve", str(folder), "--port", "0", "--set", "idle_timeout_s=1")
    with serving(command) as server:
        with evaluating(server.url, [row], script, tmp_path / "eval") as evaluation:
            evaluation.at_gate("lost")
            wait_until(lambda: ended(server.url, "session_expired") == 1, "the episode expired")
            evaluation.release("lost")
            (trace,) = evaluation.traces()
        assert_failed_unscored(trace, "410")
        assert refused(server.url, "session_expired") == 1


def test_a_drain_that_times_out_is_a_failed_rollout(
    gridsim: tuple[Path, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """SIGTERM while the episode waits for its model: the drain gives it a second, ends it as shutdown and the server
    exits; the server started again at the same address (a rolling restart) has never had it."""
    folder, row, script = gridsim
    command = gymhost_command("serve", str(folder), "--port", str(free_port()), "--drain-timeout", "1")

    def stop(server: ServerProcess) -> None:
        server.stop()

    with restarted(command, tmp_path / "eval", row, script, stop) as (evaluation, first, again):
        assert "drain timeout: 1 episode(s) still open end masked as shutdown" in first.output, first.output
        evaluation.release("lost")
        (trace,) = evaluation.traces()
        assert refused(again.url, "session_lost") == 1
    assert_failed_unscored(trace, "410")


def test_a_gym_servers_own_masked_verdict_is_a_failed_rollout(
    gym_root: Path, gym_version: tuple[int, ...], tmp_path: Path
) -> None:
    """Gym's simpleqa grades with a judge, mapped here to an address that refuses. nemo-gym 0.7.0's judge_failsafe
    answers that 200 with mask_sample true, which gymhost refuses (502); on 0.4.0 the judge's error is Gym's 500."""
    folder = gym_root / "simpleqa"
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[1])  # the capital of France
    judge = f"genrm_model=http://127.0.0.1:{free_port()}"  # nothing listens there
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--server-url", judge)) as server:
        trace = vf_eval(server.url, row, {"final": "Paris"}, tmp_path)
        if gym_version >= (0, 5):
            assert_failed_unscored(trace, "502")
            assert refused(server.url, "judge_failed") == 1
        else:
            assert_failed_unscored(trace, "500")


# -- reading the server -------------------------------------------------------------------------------------------


def pool(url: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{url}/agentenv/pool", timeout=CALL_TIMEOUT_S).json()
    return answer


def metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=CALL_TIMEOUT_S).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def refused(url: str, failure_kind: str | None = None) -> float:
    labels = {"failure_kind": failure_kind} if failure_kind else {}
    return metric(url, "gymhost_masked_verdicts_refused_total", **labels)


def ended(url: str, failure_kind: str) -> float:
    return metric(url, "gymhost_episodes_ended_total", outcome="masked", failure_kind=failure_kind)


def wait_until(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} within {timeout:g}s"
        time.sleep(0.1)
