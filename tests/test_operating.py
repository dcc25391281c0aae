"""Operating a server: Prometheus metrics, readiness, drain on SIGTERM, sessions that know their replica, JSON logs.
All on real `gymhost serve` processes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gymhost import EpisodeClient
from gymhost.environments import awrite_folder, write_folder

from .agentenv_helpers import COUNTER_TASK, make_bundle, rows
from .fault_helpers import awrite_faulty
from .gym_plays import example_rows, play_session_state
from .processes import CALL_TIMEOUT_S, STATE_TIMEOUT_S, ServerProcess, alive, descendants, gymhost_command, serving
from .verdicts import read_verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

COUNTER = "example_session_state_mgmt"
SECRET = "a-secret-both-replicas-share"
WRONG = {**COUNTER_TASK, "id": "wrong-start", "seed": {"parts": [{"kind": "data", "data": {"start": 5}}]}}


@contextmanager
def serve(folder: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    command = gymhost_command("serve", str(folder), "--port", "0", *args)
    with serving(command, env={"GYMHOST_SECRET": SECRET, **(env or {})}) as server:
        yield server


def scrape(url: str, token: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@pytest.fixture(scope="module")
def counter_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("operating")
    bundle = make_bundle(root, tasks=[COUNTER_TASK, WRONG])
    return write_folder(str(bundle), root / "root", instances="2:4").path


async def play_counter(url: str, row: dict[str, Any], by: int = 2, token: str | None = None) -> dict[str, Any]:
    async with EpisodeClient(url, token=token) as episode:
        await episode.seed(row)
        await episode.call_tool("increment", {"by": by})
        return await episode.verify(row)


async def test_metrics_count_what_the_clients_saw(counter_folder: Path) -> None:
    token = "metrics-token"
    right, wrong = (next(r for r in rows(counter_folder) if r["task_id"] == t) for t in ("count-to-3", "wrong-start"))
    with serve(counter_folder, env={"GYMHOST_TOKEN": token}) as server:
        assert httpx.get(f"{server.url}/metrics", timeout=CALL_TIMEOUT_S).status_code == 401, "a token guards /metrics"
        verdicts = [await play_counter(server.url, right, token=token) for _ in range(3)]
        verdicts += [await play_counter(server.url, wrong, token=token) for _ in range(2)]
        async with EpisodeClient(server.url, token=token) as closed:
            await closed.seed(right)
            assert (await closed.post("/close_session", {})).status_code == 200
        # Each instance serves one episode: the pool renews them as episodes end, back to both free.
        deadline = time.monotonic() + STATE_TIMEOUT_S
        auth = {"authorization": f"Bearer {token}"}
        while (
            httpx.get(f"{server.url}/agentenv/pool", headers=auth, timeout=CALL_TIMEOUT_S).json()["free"] != 2
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        samples = scrape(server.url, token)
    assert [v["reward"] for v in verdicts] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert value(samples, "gymhost_episodes_ended_total", outcome="rewarded") == 5
    assert value(samples, "gymhost_episodes_ended_total", outcome="closed") == 1
    assert value(samples, "gymhost_episodes_ended_total", outcome="masked") == 0
    assert value(samples, "gymhost_reward_count") == 5
    assert value(samples, "gymhost_reward_sum") == 3.0
    assert value(samples, "gymhost_sessions_started_total") == 6
    assert value(samples, "gymhost_tool_call_duration_seconds_count", tool="increment") == 5
    assert value(samples, "gymhost_seed_wait_seconds_count") == 6
    assert value(samples, "gymhost_episodes_open") == 0
    assert value(samples, "gymhost_instances", state="free") == 2
    verify = {"http_route": "/verify", "http_request_method": "POST", "http_response_status_code": "200"}
    assert value(samples, "http_server_request_duration_seconds_count", **verify) == 5
    assert value(samples, "http_server_request_duration_seconds_count", http_route="/increment") == 5
    assert value(samples, "http_server_request_duration_seconds_count", http_response_status_code="401") == 1
    assert all(dict(labels).get("mount") in (None, "/") for _, labels in samples), "one mount: /"


async def test_a_generic_gym_servers_episodes_are_counted_from_their_verdicts(gym_root: Path) -> None:
    row = example_rows(gym_root / COUNTER)[0]
    with serve(gym_root / COUNTER) as server:
        assert (await play_session_state(server.url, row, True))["reward"] == 1.0
        assert (await play_session_state(server.url, row, False))["reward"] == 0.0
        samples = scrape(server.url)
    assert value(samples, "gymhost_episodes_ended_total", outcome="rewarded") == 2
    assert value(samples, "gymhost_reward_sum") == 1.0
    assert value(samples, "gymhost_sessions_started_total") == 2
    assert value(samples, "gymhost_episodes_open") == 0


async def test_readiness_follows_the_pool_and_a_drain_lets_open_episodes_finish(tmp_path: Path) -> None:
    """Ready once up; not ready while the pool is below its minimum (instances start in 2 s here); on SIGTERM: not
    ready, new seeds 503 with Retry-After, the open episode plays to its reward, then the process exits, leaving no
    instance process behind."""
    folder = await awrite_faulty(tmp_path, instances=1, start_delay=2)
    each = ("--set", "source.construct_once=false")  # each instance runs the slow constructor after its fork
    with serve(folder, "--drain-timeout", "60", *each) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).json() == {"status": "ok"}
        (instance,) = httpx.get(f"{server.url}/agentenv/pool", timeout=CALL_TIMEOUT_S).json()["instances"]
        os.kill(instance["pid"], signal.SIGKILL)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (
            ready := httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S)
        ).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.status_code == 503
        assert ready.json()["reason"].startswith("warming up: 0 of its minimum of 1"), ready.json()
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (
            httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).status_code != 200 and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).status_code == 200, (
            "ready again once the replacement is up"
        )

        row = rows(folder)[0]
        episode = EpisodeClient(server.url)
        await episode.seed(row)
        processes = descendants(server.process.pid)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (
            httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).status_code == 200 and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        drained = httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S)
        assert (drained.status_code, drained.json()["reason"].split(":")[0]) == (503, "draining")
        refused = httpx.post(f"{server.url}/seed_session", json=row, timeout=CALL_TIMEOUT_S)
        assert refused.status_code == 503
        assert refused.headers["retry-after"]
        assert refused.json()["failure_kind"] == "provider_unavailable"
        assert (await episode.call_tool("add", {"n": 2})).ok, "an open episode goes on while draining"
        verdict = await episode.verify(row)
        assert (verdict["reward"], verdict["mask_sample"]) == (1.0, False)
        server.process.wait(15)  # it exits once its last episode ended, long before the drain timeout
    assert "drained: every open episode has ended" in server.output
    # Exited (a zombie the host's init reaps is an exited process: bwrap's first process ends after bwrap itself),
    # each as its parent's death reaches it (an instance forked as the server stopped goes a moment after it).
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while [pid for pid in processes if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in processes if alive(pid)], "no instance outlived the server"


async def test_a_drain_that_times_out_ends_the_rest_masked_as_shutdown(tmp_path: Path) -> None:
    folder = await awrite_faulty(tmp_path, instances=1)
    with serve(folder, "--drain-timeout", "1", "--log-format", "json") as server:
        row = rows(folder)[0]
        await EpisodeClient(server.url).seed(row)  # abandoned: never verified
        began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(20)
        assert time.monotonic() - began < 10
    ends = [json.loads(line) for line in server.lines if '"episode_end"' in line]
    assert [(end["outcome"], end["failure_kind"], end["task_id"]) for end in ends] == [
        ("masked", "shutdown", row["task_id"])
    ]
    assert ends[0]["session_id"]
    assert ends[0]["duration_s"] >= 0


async def test_json_logs_carry_each_episodes_end(counter_folder: Path) -> None:
    row = next(r for r in rows(counter_folder) if r["task_id"] == "count-to-3")
    with serve(counter_folder, "--log-format", "json") as server:
        await play_counter(server.url, row)
    lines = [json.loads(line) for line in server.lines]  # every line, the start lines too
    (start,) = [line for line in lines if line["message"].startswith("serving ")]
    assert (start["logger"], start["level"]) == ("gymhost", "INFO"), start
    assert start["message"].startswith(f"serving {counter_folder.name} at {server.url}"), start
    (end,) = [line for line in lines if line.get("event") == "episode_end"]
    assert (end["outcome"], end["reward"], end["task_id"], end["tool_calls"]) == ("rewarded", 1.0, "count-to-3", 1)
    assert end["logger"] == "gymhost.episodes"


@pytest.mark.parametrize(
    ("server_kind", "masked_verdicts"), [("published", "refuse"), ("written", "refuse"), ("published", "answer")]
)
async def test_a_session_verified_on_another_replica_is_never_a_genuine_zero(
    gym_root: Path, counter_folder: Path, server_kind: str, masked_verdicts: Literal["refuse", "answer"]
) -> None:
    """Two replicas with one secret: play on the first, verify on the second: a masked session_lost verdict naming
    the owner, refused 410 by default (on either nemo-gym), answered 200 with GYMHOST_MASKED_VERDICTS=answer. A tool
    call there is 410; a seed there starts a new episode on a Gym server, and is 410 too on a written one, whose
    cookie says its session played an episode (the model's own seed must not start it over)."""
    folder = gym_root / COUNTER if server_kind == "published" else counter_folder
    row = example_rows(folder)[0] if server_kind == "published" else rows(folder)[0]
    tool, arguments = ("increment_counter", {"count": 1}) if server_kind == "published" else ("increment", {"by": 2})
    mode = {"GYMHOST_MASKED_VERDICTS": masked_verdicts}
    with (
        serve(folder, "--replica-id", "replica-a", env=mode) as first,
        serve(folder, "--replica-id", "replica-b", env=mode) as second,
    ):
        episode = EpisodeClient(first.url)
        await episode.seed(row)
        assert (await episode.call_tool(tool, arguments)).ok
        elsewhere = EpisodeClient(second.url)
        elsewhere.cookies = episode.cookies
        elsewhere.transcript = episode.transcript
        lost_call = await elsewhere.post(f"/{tool}", arguments)
        assert lost_call.status_code == 410
        assert "replica replica-a" in lost_call.json()["detail"]
        assert lost_call.json()["owner"]["replica"] == "replica-a"
        answer = await elsewhere.post("/verify", {**row, "response": episode.transcript.response("")})
        assert answer.status_code == (410 if masked_verdicts == "refuse" else 200), answer.text
        verdict = read_verdict(answer, masked_verdicts)
        assert (verdict["reward"], verdict["mask_sample"], verdict["failure_kind"]) == (0.0, True, "session_lost")
        assert "replica replica-a" in verdict["failure_reason"]
        reseeded = await elsewhere.post("/seed_session", row)
        if server_kind == "written":
            assert reseeded.status_code == 410, reseeded.text
            assert reseeded.json()["failure_kind"] == "session_lost", reseeded.text
        else:
            assert reseeded.status_code == 200, "a seed on another replica starts a new episode there"
        assert (await episode.verify(row)).get("mask_sample") in (False, None), "the owner still has it"
        refused = scrape(second.url).get(
            ("gymhost_masked_verdicts_refused_total", (("failure_kind", "session_lost"), ("mount", "/")))
        )
        assert refused == (1.0 if masked_verdicts == "refuse" else None)


async def test_a_cookie_from_before_a_restart_is_refused_as_an_earlier_start(counter_folder: Path) -> None:
    row = rows(counter_folder)[0]
    with serve(counter_folder, "--replica-id", "steady") as before:
        episode = EpisodeClient(before.url)
        await episode.seed(row)
    with serve(counter_folder, "--replica-id", "steady") as after:
        episode.base_url = after.url
        lost = await episode.post("/increment", {"by": 2})
    assert lost.status_code == 410
    assert "an earlier start of this replica (steady" in lost.json()["detail"]


async def test_an_mcp_token_of_another_replica_is_410(gym_root: Path, gym_version: tuple[int, ...]) -> None:
    folder = gym_root / "example_mcp_weather"
    row = example_rows(folder)[0]
    with serve(folder, "--replica-id", "mcp-a") as first, serve(folder, "--replica-id", "mcp-b") as second:
        seeded = httpx.post(f"{first.url}/seed_session", json=row, timeout=30).json()
        headers = {**seeded["mcp"]["headers"], "accept": "application/json, text/event-stream"}
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        path = seeded["mcp"]["url_path"]
        here = httpx.post(f"{first.url}{path}", json=initialize, headers=headers, timeout=30)
        there = httpx.post(f"{second.url}{path}", json=initialize, headers=headers, timeout=30)
    assert here.status_code == 200, here.text
    assert there.status_code == 410, there.text
    assert there.json()["owner"]["replica"] == "mcp-a"


async def test_a_gateway_reports_readiness_and_metrics_per_mount(tmp_path: Path, gym_root: Path) -> None:
    import shutil

    root = tmp_path / "root"
    await awrite_folder(str(make_bundle(tmp_path / "bundles")), root, name="counter_env", instances=1)
    shutil.copytree(gym_root / COUNTER, root / "resources_servers" / COUNTER)
    with serve(root) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).json() == {"status": "ok"}
        assert httpx.get(f"{server.url}/counter_env/readyz", timeout=CALL_TIMEOUT_S).json() == {"status": "ok"}
        row = rows(root / "resources_servers" / "counter_env")[0]
        assert (await play_counter(f"{server.url}/counter_env", row))["reward"] == 1.0
        await play_session_state(f"{server.url}/{COUNTER}", example_rows(gym_root / COUNTER)[0], True)
        everything = scrape(server.url)
        one = scrape(f"{server.url}/counter_env")
    assert value(everything, "gymhost_sessions_started_total", mount="/counter_env") == 1
    assert value(everything, "gymhost_sessions_started_total", mount=f"/{COUNTER}") == 1
    assert value(one, "gymhost_sessions_started_total") == 1, "a mount's /metrics has its own series"
    assert {dict(labels).get("mount") for _, labels in one} <= {None, "/counter_env"}


def test_every_query_of_the_grafana_dashboard_names_an_exported_metric() -> None:
    import re

    from gymhost._metrics import exported_names

    from .conftest import REPO

    dashboard = json.loads((REPO / "deploy" / "grafana" / "gymhost.json").read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", []) if "expr" in target
    ]
    assert len(expressions) >= 8
    exported = exported_names()
    for expression in expressions:
        names = set(re.findall(r"\b((?:gymhost|http_server)_[a-z_]+)\b", expression))
        assert names, expression
        assert names <= exported, f"{expression}: {sorted(names - exported)} is not exported"


def test_every_alert_rule_names_exported_metrics_with_their_labels() -> None:
    """deploy/prometheus/gymhost-alerts.yaml's expressions name metrics gymhost exports (besides Prometheus' ``up``
    and kube-state-metrics' pod readiness), and the label values they select are ones gymhost writes."""
    import re

    import yaml

    from gymhost._metrics import exported_names

    from .conftest import REPO

    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "gymhost-alerts.yaml").read_text())["groups"][0]["rules"]
    exported = exported_names()
    for rule in rules:
        names = set(re.findall(r"\b((?:gymhost|http_server)_[a-z_]+)\b", rule["expr"]))
        assert names or re.search(r"\b(up|kube_pod_status_ready)\{", rule["expr"]), rule["expr"]
        assert names <= exported, f"{rule['alert']}: {sorted(names - exported)} is not exported"
    written = {"outcome": {"masked", "rewarded", "closed"}, "why": {"owner_gone", "another_secret"}}
    for rule in rules:
        for label, value in re.findall(r'\b(outcome|why)="([a-z_]+)"', rule["expr"]):
            assert value in written[label], f"{rule['alert']}: {label}={value!r} is never written"


def test_the_slow_tool_calls_alert_and_gymhost_top_count_the_same_routes() -> None:
    """GymhostSlowToolCalls' route selector leaves out exactly the routes ``gymhost top`` does not count."""
    import re

    import yaml

    from gymhost._watching import NOT_TOOL_CALLS

    from .conftest import REPO

    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "gymhost-alerts.yaml").read_text())["groups"][0]["rules"]
    (slow,) = [rule for rule in rules if rule["alert"] == "GymhostSlowToolCalls"]
    (pattern,) = re.findall(r'http_route!~"((?:[^"\\]|\\.)*)"', slow["expr"])
    left_out = re.compile(pattern.replace("\\\\", "\\"))  # PromQL's string escapes, then its fully anchored regex
    routes = {name if name.startswith("(") else f"/{name}" for name in NOT_TOOL_CALLS}
    assert all(left_out.fullmatch(route) for route in routes), sorted(r for r in routes if not left_out.fullmatch(r))
    assert all(left_out.fullmatch(f"/gridsim{route}") for route in routes if route.startswith("/") and route != "/")
    assert not any(left_out.fullmatch(route) for route in ("/get_weather", "/increment", "/gridsim_look"))


async def test_a_fresh_server_exports_its_loss_and_stop_counters_at_zero(counter_folder: Path) -> None:
    """The alerts on lost episodes and stopped instances see a first burst only if the series were there before
    it, at 0 (``increase`` over a series that appears at N sees nothing)."""
    with serve(counter_folder) as server:
        samples = scrape(server.url)
    for why in ("owner_gone", "another_secret"):
        assert samples[("gymhost_lost_session_requests_total", (("mount", "/"), ("why", why)))] == 0.0
    for reason in ("memory", "processes", "cpu_time", "file_size", "exited"):
        assert samples[("gymhost_instance_stops_total", (("mount", "/"), ("reason", reason)))] == 0.0


def test_every_gymhost_metric_has_labels_so_workers_export_it() -> None:
    """``share_metrics`` switches prometheus_client to multiprocess mode after gymhost's metrics are defined; a
    metric without labels has its value made at definition, in memory, and ``/metrics`` under ``--workers`` would
    never show it (the listen-overflow counter was such a one)."""
    from gymhost._metrics import _OURS

    assert [metric._name for metric in _OURS if not metric._labelnames] == []
