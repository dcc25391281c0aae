"""Graceful shutdown of a real `gymhost serve`: requests in flight finish within the bound, open episodes are torn
down, instances stop; and nothing is left under the temporary directory, even by a server that was killed."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost.environments import write_folder

from .agentenv_helpers import GRIDSIM, environment_process, make_bundle, rows
from .processes import CALL_TIMEOUT_S, ServerProcess, alive, assert_stopped_cleanly, children, gymhost_command, serving
from .test_folder_errors import SERVER, make_folder

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.usefixtures("clean_env")]


def seeded(server: ServerProcess, row: dict[str, Any]) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=60)
    answer = client.post("/seed_session", json=row)
    assert answer.status_code == 200, answer.text
    return client


def stop_while(server: ServerProcess, call: Any, after_s: float) -> tuple[Any, float]:
    """Start ``call`` in a thread, SIGTERM the server ``after_s`` into it; the call's outcome and the time the
    server took to exit after the signal."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(call)
        time.sleep(after_s)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(60)
        took = time.monotonic() - signalled
        try:
            return outcome.result(30), took
        except httpx.HTTPError as error:
            return error, took


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shutdown")
    return write_folder(str(make_bundle(root)), root / "root", instances=1).path


@pytest.mark.parametrize("server_name", ["uvicorn", "hypercorn"])
def test_a_call_in_flight_finishes_and_then_the_instances_stop(counter: Path, server_name: str) -> None:
    with serving(gymhost_command("serve", str(counter), "--port", "0", "--server", server_name)) as server:
        (pid,) = [
            i["pid"] for i in httpx.get(f"{server.url}/agentenv/pool", timeout=CALL_TIMEOUT_S).json()["instances"]
        ]
        client = seeded(server, rows(counter)[0])
        answer, took = stop_while(server, lambda: client.post("/stall", json={"seconds": 2}), after_s=0.5)
        assert answer.status_code == 200, answer
        assert json.loads(answer.text) == {"count": 1}
        assert took < 10
    assert_stopped_cleanly(server)
    assert not alive(pid)


def test_a_call_longer_than_the_grace_period_is_cut_and_the_server_still_exits(counter: Path) -> None:
    command = gymhost_command("serve", str(counter), "--port", "0", "--graceful-timeout", "1")
    with serving(command) as server:
        (pid,) = [
            i["pid"] for i in httpx.get(f"{server.url}/agentenv/pool", timeout=CALL_TIMEOUT_S).json()["instances"]
        ]
        client = seeded(server, rows(counter)[0])
        answer, took = stop_while(server, lambda: client.post("/stall", json={"seconds": 30}), after_s=0.5)
        assert isinstance(answer, httpx.HTTPError) or answer.status_code >= 500, answer
        assert took < 15  # 1 s of grace, then teardown: not the 30 s the call wanted
    assert not alive(pid)


def test_shutdown_tears_down_the_open_episode_on_an_instance_it_does_not_own(tmp_path: Path) -> None:
    """Instances at URLs outlive the server: what shutdown must do to them is end the episode and reset them."""
    with environment_process() as environment:
        written = write_folder(environment.url, tmp_path, tasks_file=str(GRIDSIM / "tasks" / "eval.jsonl")).path
        row = next(r for r in rows(written) if r["task_id"] == "corridor-east")
        with serving(gymhost_command("serve", str(written), "--port", "0")) as server:
            client = seeded(server, row)
            assert client.post("/gridsim_move", json={"direction": "right"}).status_code == 200
            state = client.get("/agentenv/pool/0").json()["data"]
            assert state["loaded"] is True
        assert_stopped_cleanly(server)
        reply = httpx.post(
            f"{environment.url}/agentenv",
            json={"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}},
            timeout=CALL_TIMEOUT_S,
        ).json()
        (part,) = reply["result"]["parts"]
        assert part["data"] == {"loaded": False}


@pytest.fixture
def temporary() -> Iterator[Path]:
    """A temporary directory of the test's own for the servers (TMPDIR), short enough for the sockets in it."""
    folder = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def gymhost_folders(temporary: Path) -> dict[str, list[int]]:
    """gymhost's folders there, by kind, each as the pid of the process that made it."""
    found: dict[str, list[int]] = {}
    for entry in temporary.iterdir():
        kind, _, rest = entry.name.removeprefix("gymhost-").partition("-")
        if entry.name.startswith("gymhost-"):
            found.setdefault(kind, []).append(int(rest.split("-")[0]))
    return {kind: sorted(pids) for kind, pids in found.items()}


def wait_for_folders(temporary: Path, expected: dict[str, list[int]]) -> None:
    deadline = time.monotonic() + 60
    while gymhost_folders(temporary) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gymhost_folders(temporary) == expected


def in_group(group: int) -> list[int]:
    """The live processes of a process group (a zombie waiting for its reaper does not count)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry))
    return found


def test_a_killed_servers_folders_go_at_the_next_start_and_a_clean_stop_leaves_none(
    counter: Path, temporary: Path
) -> None:
    """Workers, each with process instances: the supervisor's folder (the workers' sockets and metrics) and each
    worker's (its instances' sockets). Killed with SIGKILL, all of them, the server cannot remove them; the next
    start does. A worker killed alone: the supervisor, which outlives it, removes its folder as it starts another.
    Stopped with SIGTERM: nothing is left."""
    command = gymhost_command("serve", str(counter), "--port", "0", "--workers", "2")
    with serving(command, env={"TMPDIR": str(temporary)}) as killed:
        workers = children(killed.process.pid)
        wait_for_folders(temporary, {"workers": [killed.process.pid], "instances": workers})
        os.killpg(killed.process.pid, signal.SIGKILL)
        killed.process.wait(20)
        deadline = time.monotonic() + 30
        while in_group(killed.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not in_group(killed.process.pid)
    assert gymhost_folders(temporary) == {"workers": [killed.process.pid], "instances": workers}, "left behind"

    with serving(command, env={"TMPDIR": str(temporary)}) as server:
        workers = children(server.process.pid)
        wait_for_folders(temporary, {"workers": [server.process.pid], "instances": workers})  # the killed one's gone
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (victim in children(server.process.pid) or len(children(server.process.pid)) < 2) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        workers = children(server.process.pid)
        assert victim not in workers
        assert len(workers) == 2
        wait_for_folders(temporary, {"workers": [server.process.pid], "instances": workers})
    assert_stopped_cleanly(server)
    assert gymhost_folders(temporary) == {}


def test_a_gateways_shared_metrics_folder_goes_when_it_stops(gym_root: Path, tmp_path: Path, temporary: Path) -> None:
    """``--venv`` on a root: its process mounts would keep their metrics in a folder the gateway renders from."""
    root = tmp_path / "root"
    for name in ("example_single_tool_call", "example_session_state_mgmt"):
        shutil.copytree(gym_root / name, root / "resources_servers" / name)
    command = gymhost_command("serve", str(root), "--port", "0", "--venv")
    with serving(command, env={"TMPDIR": str(temporary)}) as server:
        assert gymhost_folders(temporary) == {"metrics": [server.process.pid]}
    assert_stopped_cleanly(server)
    assert gymhost_folders(temporary) == {}


@pytest.mark.parametrize("sandbox", ["off", "strict"])
def test_a_second_sigterm_while_draining_stops_at_once_without_a_traceback(tmp_path: Path, sandbox: str) -> None:
    """The drain's own words: "a second signal stops at once". It does, whether the server runs confined or not,
    and says nothing more than that it stopped: no lifespan traceback for the shutdown it skips."""
    folder = make_folder(tmp_path)
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--sandbox", sandbox)) as server:
        seeded(server, {}).close()  # an open episode: the first signal drains, waiting for it
        server.process.send_signal(signal.SIGTERM)
        with httpx.Client(base_url=server.url, timeout=CALL_TIMEOUT_S) as probe:
            while probe.get("/readyz").status_code == 200:  # the drain has begun
                time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(CALL_TIMEOUT_S)
    assert "draining: no new episodes" in server.output, server.output
    assert_stopped_cleanly(server)


SWALLOWING = """\
import time

print("echo-app: importing", flush=True)
try:
    time.sleep(120)
except BaseException:  # as a bare except around an import does, or importlib's module-lock callback: swallowed
    pass
"""


def test_a_sigterm_whose_exception_the_build_swallowed_still_stops_the_server_before_it_serves(
    tmp_path: Path,
) -> None:
    """The signal lands in an import that swallows its exception; the server builds on, then dies by it instead of
    serving (importlib's weakref callback swallowed one once, and the server served on, SIGTERM ignored)."""
    folder = make_folder(tmp_path, app=SWALLOWING + SERVER)
    command = gymhost_command("serve", str(folder), "--port", "0")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    seen = []
    for line in server.stdout:  # the import prints its line, then sleeps: it cannot end before the signal
        seen.append(line)
        if line.startswith("echo-app: importing"):
            break
    server.send_signal(signal.SIGTERM)
    try:
        rest, _ = server.communicate(timeout=CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        rest, _ = server.communicate()
    output = "".join(seen) + rest
    assert server.returncode == -signal.SIGTERM, output
    assert "gymhost: serving" not in output, output
