"""Gym's own launcher runs a written folder: `gym env start` on the written configs, an episode played through Gym's
agent path (environment server on 0.7.0, simple agent, vllm_model, a scripted model), and a stop that leaves no
process behind. Everything on 127.0.0.1; Ray too (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps it off the node's
address).

No venv is built: the launcher is told to reuse this tier's venv (`uv_venv_dir`, `skip_venv_if_present`), as the
written README says. Building one per server from requirements.txt needs uv and several minutes per server; the
requirement line it would install gymhost from is checked in test_agentenv_write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost.environments import write_folder

from .agentenv_helpers import GRIDSIM
from .processes import free_port, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.usefixtures("clean_env")]

NAME = "gridsim_v1"
TASK = "report-position"  # three tool calls and a final answer that the grading reads
GYM = Path(sys.executable).with_name("gym")


def session_processes(session: int) -> list[str]:
    """The live processes of a session (the launcher runs in its own): what a stop must leave empty."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes().replace(b'\0', b' ').decode()[:150]}")
        except (OSError, IndexError, ValueError):
            continue
    return found


def venv_tree(root: Path, servers: list[str]) -> Path:
    """`<dir>/<server>/.venv` for every server, each this tier's venv: what `uv_venv_dir` with
    `skip_venv_if_present` reuses instead of building."""
    for server in servers:
        (root / server).mkdir(parents=True)
        (root / server / ".venv").symlink_to(sys.prefix)
    return root


def wait_until_ready(launcher: subprocess.Popen[str], log: Path, head: str, timeout: float = 240) -> None:
    """0.7.0's head server answers /readyz once every server is; 0.4.0's has none, and prints that line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert launcher.poll() is None, f"the launcher exited with {launcher.returncode}:\n{log.read_text()[-4000:]}"
        if "servers ready!" in log.read_text():
            return
        try:
            if httpx.get(f"{head}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the launcher was not ready in {timeout:g}s:\n{log.read_text()[-4000:]}")


def test_gyms_launcher_runs_a_written_folder_and_plays_an_episode(tmp_path: Path, gym_version: tuple[int, ...]) -> None:
    root = tmp_path / "root"
    folder = write_folder(str(GRIDSIM), root).path
    configs = [f"resources_servers/{NAME}/configs/{NAME}.yaml"]
    servers = [f"resources_servers/{NAME}", "responses_api_agents/simple_agent", "responses_api_models/vllm_model"]
    if gym_version >= (0, 5):  # environment servers, which 0.4.0's launcher has not and refuses
        configs.append(f"resources_servers/{NAME}/configs/{NAME}_environment_server.yaml")
        servers.append("environment_servers/legacy_agent")
    venvs = venv_tree(tmp_path / "venvs", servers)
    row = next(json.loads(line) for line in (folder / "data" / "eval.jsonl").read_text().splitlines() if TASK in line)
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    task = next(
        json.loads(line) for line in (GRIDSIM / "tasks" / "eval.jsonl").read_text().splitlines() if TASK in line
    )
    script = {"steps": task["solution"]["tool_calls"], "final": task["solution"]["final_text"]}

    model_port, head_port = free_port(), free_port()
    head = ["++head_server.host=127.0.0.1", f"++head_server.port={head_port}"]
    model = [sys.executable, str(Path(__file__).with_name("scripted_model.py")), "--port", str(model_port)]
    environment = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    start = [str(GYM), "env", "start", *(arg for config in configs for arg in ("--config", config))]
    start += ["--model-type", "vllm_model", "--model-url", f"http://127.0.0.1:{model_port}/v1", "--model", "scripted"]
    start += ["--model-api-key", "unused", *head, f"++uv_venv_dir={venvs}", "++skip_venv_if_present=true"]
    log = tmp_path / "launcher.log"
    with serving(
        [*model, "--script", json.dumps(script)], url=f"http://127.0.0.1:{model_port}", ready_path="/v1/models"
    ):
        with log.open("w") as output:
            launcher = subprocess.Popen(
                start, cwd=root, env=environment, stdout=output, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,  # its processes, Ray's included, are found by session afterwards
            )  # fmt: skip
        try:
            wait_until_ready(launcher, log, f"http://127.0.0.1:{head_port}")
            collect = [str(GYM), "eval", "run", "--no-serve", "-i", str(tmp_path / "rows.jsonl"), "-o"]
            collect += [str(tmp_path / "rollouts.jsonl"), *head]
            done = subprocess.run(collect, cwd=root, env=environment, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            rollouts: list[dict[str, Any]] = [
                json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines() if line.strip()
            ]
        finally:
            # Stopped as a user stops it: Ctrl-C. It stops its servers (SIGINT, then SIGKILL after a second) and Ray.
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGINT)
            try:
                launcher.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                raise AssertionError(f"the launcher ignored Ctrl-C:\n{log.read_text()[-4000:]}") from None
    assert [(r["task_id"], r["reward"], r.get("mask_sample", False)) for r in rollouts] == [(TASK, 1.0, False)]
    deadline = time.monotonic() + 10  # its servers' own children (environment instances) go by their death pipes
    while (left := session_processes(launcher.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
