"""Graceful shutdown of a real `gymhost serve`: requests in flight finish within the bound, open episodes are torn
down, instances stop."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost.environments import write_folder

from .agentenv_helpers import GRIDSIM, environment_process, make_bundle, rows
from .processes import ServerProcess, alive, assert_stopped_cleanly, gymhost_command, serving

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
        (pid,) = [i["pid"] for i in httpx.get(f"{server.url}/agentenv/pool").json()["instances"]]
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
        (pid,) = [i["pid"] for i in httpx.get(f"{server.url}/agentenv/pool").json()["instances"]]
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
            f"{environment.url}/agentenv", json={"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}}
        ).json()
        (part,) = reply["result"]["parts"]
        assert part["data"] == {"loaded": False}
