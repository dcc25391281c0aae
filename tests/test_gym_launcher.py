"""Gym's own launcher runs a written folder: `gym env start` on the written configs, an episode played through Gym's
agent path (environment server on 0.7.0, simple agent, vllm_model, a scripted model), and a stop that leaves no
process behind. Everything on 127.0.0.1; Ray too (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps it off the node's
address).

No venv is built: the launcher is told to reuse this tier's venv (`uv_venv_dir`, `skip_venv_if_present`), as the
written README says. Building one per server from requirements.txt needs uv and several minutes per server; the
requirement line it would install gymhost from is checked in test_agentenv_write.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost.environments import write_folder

from .agentenv_helpers import GRIDSIM
from .processes import CALL_TIMEOUT_S, alive, descendants, free_port, parent, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.usefixtures("clean_env")]

NAME = "gridsim_v1"
TASK = "report-position"  # three tool calls and a final answer that the grading reads
LOST = "reach-corner"  # two moves; its instance is killed before the final turn
GYM = Path(sys.executable).with_name("gym")
DRAIN_TIMEOUT_S = 5  # the written server's drain, set for the launcher's servers through the environment
# After Ctrl-C the written server is gone within its drain and this much more, however busy the machine (it has the
# SIGINT, and Gym's launcher sends it SIGINT, then SIGKILL a second later: unless the launcher is slow to act, as it
# has been for minutes here, in Ray's shutdown). Its pool follows it by PR_SET_PDEATHSIG, within as long again: what
# gymhost answers for is that nothing of its outlives the server that started it.
GYMHOST_STOP_BOUND_S = DRAIN_TIMEOUT_S + 60
# How long the launcher itself (and Ray under it) may take to exit after Ctrl-C before it is killed and reported: its
# own slowness is Gym's and Ray's, not a failure of gymhost's.
LAUNCHER_STOP_BOUND_S = 240


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
    """Two rows through Gym's agent path: one played right (1.0), and one whose environment instance is killed while
    its model thinks (the scripted model waits at a gate meanwhile). That episode is lost: Gym 0.5+'s collection gets
    it as a masked sample and goes on; Gym 0.4.0's, which reads no mask_sample, gets its verify refused and stops
    (as it stops on any error) with the refusal in its output, never with a reward for it."""
    root = tmp_path / "root"
    folder = write_folder(str(GRIDSIM), root).path
    configs = [f"resources_servers/{NAME}/configs/{NAME}.yaml"]
    servers = [f"resources_servers/{NAME}", "responses_api_agents/simple_agent", "responses_api_models/vllm_model"]
    if gym_version >= (0, 5):  # environment servers, which 0.4.0's launcher has not and refuses
        configs.append(f"resources_servers/{NAME}/configs/{NAME}_environment_server.yaml")
        servers.append("environment_servers/legacy_agent")
    venvs = venv_tree(tmp_path / "venvs", servers)
    rows, tasks = (
        {
            task: next(json.loads(line) for line in (base / "eval.jsonl").read_text().splitlines() if task in line)
            for task in (TASK, LOST)
        }
        for base in (folder / "data", GRIDSIM / "tasks")
    )
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(rows[task]) + "\n" for task in (TASK, LOST)))
    scripts = [
        {
            "match": tasks[task]["prompt"]["user"],
            "steps": tasks[task]["solution"]["tool_calls"],
            "final": tasks[task]["solution"].get("final_text") or "Done.",
        }
        for task in (TASK, LOST)
    ]
    scripts[1]["gates"] = {str(len(scripts[1]["steps"])): "lost"}  # before its final turn: after every move
    gates = tmp_path / "gates"
    gates.mkdir()

    model_port, head_port = free_port(), free_port()
    head = ["++head_server.host=127.0.0.1", f"++head_server.port={head_port}"]
    model = [sys.executable, str(Path(__file__).with_name("scripted_model.py")), "--port", str(model_port)]
    model += ["--gates", str(gates), "--script", json.dumps({"scripts": scripts})]
    environment = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    environment["GYMHOST_DRAIN_TIMEOUT"] = str(DRAIN_TIMEOUT_S)
    start = [str(GYM), "env", "start", *(arg for config in configs for arg in ("--config", config))]
    start += ["--model-type", "vllm_model", "--model-url", f"http://127.0.0.1:{model_port}/v1", "--model", "scripted"]
    start += ["--model-api-key", "unused", *head, f"++uv_venv_dir={venvs}", "++skip_venv_if_present=true"]
    log = tmp_path / "launcher.log"
    gymhosts: list[int] = []  # the written server's process and its pool's (template and instances), by PID
    with serving(model, url=f"http://127.0.0.1:{model_port}", ready_path="/v1/models"):
        with log.open("w") as output:
            launcher = subprocess.Popen(
                start, cwd=root, env=environment, stdout=output, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,  # its processes, Ray's included, are found by session afterwards
            )  # fmt: skip
        try:
            wait_until_ready(launcher, log, f"http://127.0.0.1:{head_port}")
            collect = [str(GYM), "eval", "run", "--no-serve", "-i", str(tmp_path / "rows.jsonl"), "-o"]
            collect += [str(tmp_path / "rollouts.jsonl"), *head]
            collecting = subprocess.Popen(
                collect, cwd=root, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            try:
                gymhosts = kill_the_lost_episodes_instance(gates, f"http://127.0.0.1:{head_port}", collecting)
                said, _ = collecting.communicate(timeout=300)
            finally:
                (gates / "lost.go").touch()  # never leave the model holding a turn
                if collecting.poll() is None:
                    collecting.kill()
                    collecting.wait()
            written = tmp_path / "rollouts.jsonl"
            lines = written.read_text().splitlines() if written.exists() else []
            rollouts: list[dict[str, Any]] = [json.loads(line) for line in lines if line.strip()]
        finally:
            # Stopped as a user stops it: Ctrl-C, which a terminal sends to its foreground process group: the
            # launcher and the servers it started (which the launcher also sends SIGINT, then SIGKILL after a
            # second), and Ray.
            if launcher.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(launcher.pid, signal.SIGINT)  # (its own group: started in a session of its own)
            stop_noted = time.monotonic()
            server_ended = server_stopped(gymhosts[:1], stop_noted + GYMHOST_STOP_BOUND_S)
            gymhost_left = wait_for_gone(gymhosts, server_ended + GYMHOST_STOP_BOUND_S)
            stopped_by_ctrl_c(launcher, log, stop_noted + LAUNCHER_STOP_BOUND_S)
    assert not gymhost_left, (
        f"gymhost's processes outlived their server by {GYMHOST_STOP_BOUND_S} s: "
        f"{[process_line(pid) for pid in gymhost_left]}\n{log.read_text()[-3000:]}"
    )
    played = sorted((r["task_id"], r["reward"], r.get("mask_sample", False)) for r in rollouts)
    if gym_version >= (0, 5):
        assert collecting.returncode == 0, said[-3000:]
        assert played == [(LOST, 0.0, True), (TASK, 1.0, False)], said[-3000:]
    else:
        assert collecting.returncode != 0, f"Gym 0.4.0's collection went on past a lost episode: {played}"
        assert LOST not in [task for task, _, _ in played], played
        assert "500, message='Internal Server Error'" in said, said[-3000:]  # Gym's agent, on the refused verify
        assert '"POST /verify HTTP/1.1" 502 Bad Gateway' in log.read_text(), log.read_text()[-3000:]
    # What is left of the launcher's session now is Gym's and Ray's own (gymhost's are gone, above): a leftover is
    # killed and reported, not counted against gymhost.
    deadline = time.monotonic() + 30
    while (left := session_processes(launcher.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        kill_session(launcher.pid)
        warnings.warn(f"Gym's launcher left processes of its own after it exited; killed: {left}", stacklevel=1)


def server_stopped(server: list[int], deadline: float) -> float:
    """When the written server's process (``server``: it, or nothing if the test never found it) ended: it stops on
    the Ctrl-C. If it has not by ``deadline``, it is killed here, as the launcher would have killed it a second after
    its SIGINT, and that is reported in the test's warnings."""
    if wait_for_gone(server, deadline):
        for pid in server:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for_gone(server, time.monotonic() + 30)
        warnings.warn("the written server had not stopped after Ctrl-C: killed it", stacklevel=1)
    return time.monotonic()


def wait_for_gone(pids: list[int], deadline: float) -> list[int]:
    """Wait until none of ``pids`` runs, or the deadline passes; the ones still running."""
    while (running := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return running


def process_line(pid: int) -> str:
    try:
        return f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\0', b' ').decode()[:150]}"
    except OSError:
        return f"{pid}: gone"


def kill_session(session: int) -> None:
    """SIGKILL every process left in a session: the launcher's group and any group Ray's processes made in it."""
    for line in session_processes(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)


def kill_the_lost_episodes_instance(gates: Path, head: str, collecting: subprocess.Popen[str]) -> list[int]:
    """Once the lost row's model holds its final turn and the other row's episode is over, SIGKILL the environment
    instance the lost row's episode leased (found through the written server's pool, at the address Gym's head server
    gave it), then let the model answer. Returns gymhost's processes: the written server's and its pool's."""
    deadline = time.monotonic() + 180
    while not (gates / "lost.reached").exists():
        assert collecting.poll() is None, f"the collection ended before the gate:\n{collecting.communicate()[0]}"
        assert time.monotonic() < deadline, "the lost row's episode never reached its gate"
        time.sleep(0.1)
    from omegaconf import OmegaConf  # the nemo_gym tier's (this module is collected by the unit tier too)

    config = OmegaConf.to_container(
        OmegaConf.create(json.loads(httpx.get(f"{head}/global_config_dict_yaml", timeout=CALL_TIMEOUT_S).text))
    )
    assert isinstance(config, dict)
    entries = [entry for entry in config.values() if isinstance(entry, dict)]  # config_paths is a list
    (server,) = [entry["resources_servers"][NAME] for entry in entries if NAME in entry.get("resources_servers", {})]
    # The other row plays at the same time and is not held: once its episode is over, the one instance still leased
    # is the lost row's.
    while True:
        pool = httpx.get(f"http://{server['host']}:{server['port']}/agentenv/pool", timeout=CALL_TIMEOUT_S).json()
        leased = [instance for instance in pool["instances"] if instance["state"] == "leased"]
        if len(leased) == 1:
            break
        assert collecting.poll() is None, f"the collection ended with the lost row held:\n{collecting.communicate()[0]}"
        assert time.monotonic() < deadline, f"the other row's episode never ended: {pool}"
        time.sleep(0.1)
    server_pid = listening_pid(int(server["port"]))
    gymhosts = [server_pid, *descendants(server_pid)]
    assert leased[0]["pid"] in gymhosts, (leased, gymhosts)
    os.kill(leased[0]["pid"], signal.SIGKILL)
    (gates / "lost.go").touch()
    return gymhosts


def listening_pid(port: int) -> int:
    """The process listening on ``port`` of 127.0.0.1 (``ss``, iproute2: the tier's recipe installs it)."""
    listing = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    pids = {int(pid) for pid in re.findall(r"pid=(\d+)", listing)}
    # A child forked after the bind may hold the socket too: the server is the one whose parent does not.
    servers = [pid for pid in pids if parent(pid) not in pids]
    assert len(servers) == 1, f"expected one process listening on {port}: {listing!r}"
    return servers[0]


def stopped_by_ctrl_c(launcher: subprocess.Popen[str], log: Path, deadline: float) -> None:
    """Ray shuts down slowly on a loaded machine: the launcher may take until ``deadline`` to exit. Past it, its
    session is killed and the slowness reported in the test's warnings: it is Gym's and Ray's, not gymhost's (whose
    own processes the test has already waited for by PID)."""
    try:
        launcher.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_session(launcher.pid)
        launcher.wait()
        warnings.warn(
            f"Gym's launcher ignored Ctrl-C until it was killed, {LAUNCHER_STOP_BOUND_S} s on:\n"
            f"{log.read_text()[-2000:]}",
            stacklevel=1,
        )
