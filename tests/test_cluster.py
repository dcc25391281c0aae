"""Several hosts behind a load balancer, for real: three gymhost replicas, each in a network namespace of its own with
its own address on a bridge, HAProxy in front running deploy/haproxy/haproxy.cfg, and a verifiers-style client (a
new connection for every request, the cookies of `/seed_session` replayed). Replicas are killed, cut off and drained
in the middle of runs: the episodes they held end as an error or a masked session_lost, never a genuine-looking
score, and every other episode scores right. Needs root (it makes the namespaces) and HAProxy (`make test` installs
it); it fails, never skips, without them, and removes its namespaces whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gymhost import EpisodeClient
from gymhost.environments import Task, load_tasks, write_folder

from .agentenv_helpers import GRIDSIM, rows
from .conftest import REPO
from .gym_plays import example_rows, play_mcp_weather
from .processes import ServerProcess, free_port, gymhost_command, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.cluster, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BRIDGE, NET, REPLICAS = "ghbr0", "10.77.0", (1, 2, 3)
SECRET = "one-secret-for-every-replica"
COUNTER = "example_session_state_mgmt"
WEATHER = "example_mcp_weather"
TASKS: dict[str, Task] = {task.id: task for task in load_tasks(GRIDSIM / "tasks" / "eval.jsonl")}
LOST = {"session_lost"}


def sh(*command: str, check: bool = True) -> None:
    subprocess.run(command, check=check, capture_output=True, timeout=30)


def teardown_network() -> None:
    for i in REPLICAS:
        sh("ip", "netns", "del", f"ghr{i}", check=False)
        sh("ip", "link", "del", f"ghv{i}", check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


@pytest.fixture(scope="module")
def network() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.fail("the cluster tier makes network namespaces: run it as root (CI does)")
    teardown_network()
    try:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i in REPLICAS:
            sh("ip", "netns", "add", f"ghr{i}")
            sh("ip", "link", "add", f"ghv{i}", "type", "veth", "peer", "name", "eth0", "netns", f"ghr{i}")
            sh("ip", "link", "set", f"ghv{i}", "master", BRIDGE, "up")
            sh("ip", "-n", f"ghr{i}", "addr", "add", f"{NET}.1{i}/24", "dev", "eth0")
            sh("ip", "-n", f"ghr{i}", "link", "set", "eth0", "up")
            sh("ip", "-n", f"ghr{i}", "link", "set", "lo", "up")
        yield
    finally:
        teardown_network()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, gym_root: Path) -> Path:
    """One Gym root served by every replica: a written gridsim, and two of Gym's own servers."""
    root = tmp_path_factory.mktemp("cluster")
    write_folder(str(GRIDSIM), root, mode="in-process", instances="4:128")
    for name in (COUNTER, WEATHER):
        shutil.copytree(gym_root / name, root / "resources_servers" / name)
    return root


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.replicas: dict[int, ServerProcess] = {}
        self.exits: dict[int, Any] = {}

    def address(self, i: int) -> str:
        return f"http://{NET}.1{i}:8000"

    def start(self, i: int) -> None:
        command = [
            "ip", "netns", "exec", f"ghr{i}",
            *gymhost_command(
                "serve", str(self.root), "--host", "0.0.0.0", "--port", "8000", "--replica-id", f"r{i}",
                # The drain ends when the episodes do: its bound only ends one that never would, far past what a
                # loaded machine takes to play a drained replica's episodes.
                "--advertise-url", self.address(i), "--drain-timeout", "300",
                "--no-token",  # reached only inside this test's network namespaces
            ),
        ]  # fmt: skip
        context = serving(command, url=self.address(i), ready_path="/readyz", env={"GYMHOST_SECRET": SECRET})
        self.exits[i] = context
        self.replicas[i] = context.__enter__()

    def stop(self, i: int) -> None:
        """At once: a second signal skips the drain (a replica cut off still holds episodes nobody will end)."""
        process = self.replicas[i].process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        context = self.exits.pop(i)
        context.__exit__(None, None, None)
        self.replicas.pop(i, None)


@pytest.fixture(scope="module")
def cluster(network: None, root: Path) -> Iterator[Cluster]:
    started = Cluster(root)
    try:
        for i in REPLICAS:
            started.start(i)
        yield started
    finally:
        for i in list(started.exits):
            started.stop(i)


@pytest.fixture(scope="module")
def balancer(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """deploy/haproxy/haproxy.cfg, with this test's addresses in place of the recipe's."""
    recipe = (REPO / "deploy" / "haproxy" / "haproxy.cfg").read_text()
    port = free_port()
    servers = "\n".join(f"    server r{i} {NET}.1{i}:8000 check cookie r{i}" for i in REPLICAS)
    config = re.sub(r"(?m)^    server r\d .*\n?", "", recipe).rstrip() + "\n" + servers + "\n"
    config = config.replace("    bind :8080", f"    bind 127.0.0.1:{port}")
    path = tmp_path_factory.mktemp("haproxy") / "haproxy.cfg"
    path.write_text(config)
    checked = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    process = subprocess.Popen(["haproxy", "-db", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: all_up(url), "every replica is up behind HAProxy", 30)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


def all_up(url: str) -> bool:
    """Each replica answers through the balancer (its own affinity cookie pins a request to it)."""
    try:
        return all(
            httpx.get(f"{url}/readyz", cookies={"GYMHOST_REPLICA": f"r{i}"}, timeout=3).status_code == 200
            for i in REPLICAS
        )
    except httpx.TransportError:
        return False


def wait_until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(0.2)


@dataclass
class Outcome:
    kind: str  # "verdict" or "error"
    replica: str  # the affinity cookie of its seed: the replica that held it
    expected: float
    verdict: dict[str, Any] | None = None
    error: str = ""

    @property
    def right(self) -> bool:
        assert self.verdict is not None
        return not self.verdict.get("mask_sample") and self.verdict["reward"] == self.expected


async def episode(base: str, root: Path, kind: str, n: int, think: float = 0.0) -> Outcome:
    """One episode as verifiers plays it; any answer that is not a success is recorded, not raised."""
    if kind == "gridsim":
        row = rows(root / "resources_servers" / "gridsim_v1")[n % 10]
        solution = TASKS[row["task_id"]].solution
        assert solution is not None
        calls = [(call.name, call.arguments) for call in solution.tool_calls]
        final, expected, prefix = solution.final_text, 1.0, "/gridsim_v1"
    else:
        row = example_rows(root / "resources_servers" / COUNTER)[0]
        right = (n // 2) % 2 == 0  # counter episodes are the odd ones: every other one plays wrong
        step = row["expected_count"] - row["initial_count"] + (0 if right else 1)
        calls, final, expected, prefix = (
            [("increment_counter", {"count": step})],
            "",
            1.0 if right else 0.0,
            f"/{COUNTER}",
        )
    replica = "?"
    try:
        async with EpisodeClient(base + prefix, timeout=60) as client:
            await client.seed(row)
            replica = client.cookies.get("GYMHOST_REPLICA") or "?"
            for name, arguments in calls:
                if think:
                    await asyncio.sleep(think)
                output = await client.call_tool(name, arguments)
                if not output.ok:
                    return Outcome(
                        "error", replica, expected, error=f"{name}: {output.status_code} {output.text[:200]}"
                    )
            return Outcome("verdict", replica, expected, verdict=await client.verify(row, final))
    except httpx.HTTPStatusError as error:
        return Outcome("error", replica, expected, error=f"{error.response.status_code} {error.response.text[:200]}")
    except httpx.TransportError as error:
        return Outcome("error", replica, expected, error=repr(error))


async def run(
    cluster: Cluster,
    base: str,
    count: int,
    concurrency: int,
    think: float = 0.0,
    during: Callable[[], Awaitable[None]] | None = None,
) -> list[Outcome]:
    """``count`` episodes, half gridsim (the reference play: 1.0), half counter (right: 1.0, wrong: 0.0)."""
    limit = asyncio.Semaphore(concurrency)
    kinds = ["gridsim", "counter"]

    async def one(n: int) -> Outcome:
        async with limit:
            return await episode(base, cluster.root, kinds[n % 2], n, think)

    tasks = [asyncio.create_task(one(n)) for n in range(count)]
    if during is not None:
        await during()
    return list(await asyncio.gather(*tasks))


async def holding_episodes(cluster: Cluster, i: int) -> None:
    """Until replica ``i`` holds open episodes (its own gauge, read directly): what a test that takes it away
    mid-run needs, whatever the machine's speed and the balancer's spread."""

    def open_episodes() -> float:
        text = httpx.get(f"{cluster.address(i)}/metrics", timeout=10).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "gymhost_episodes_open"
        )

    deadline = time.monotonic() + 60
    while await asyncio.to_thread(open_episodes) < 2:
        assert time.monotonic() < deadline, f"r{i} never held episodes"
        await asyncio.sleep(0.1)


def summary(outcomes: list[Outcome]) -> str:
    wrong = [o for o in outcomes if o.kind == "verdict" and not o.right]
    errors = [o for o in outcomes if o.kind == "error"]
    return f"{len(outcomes)} episodes; {len(wrong)} not right: {wrong[:3]}; {len(errors)} errors: {errors[:3]}"


async def test_300_episodes_through_haproxy_all_score_right(balancer: str, cluster: Cluster) -> None:
    outcomes = await run(cluster, balancer, 300, 32)
    assert all(o.kind == "verdict" and o.right for o in outcomes), summary(outcomes)
    assert {o.replica for o in outcomes} == {"r1", "r2", "r3"}, "the balancer spread the episodes"
    assert sum(o.expected == 0.0 for o in outcomes) == 75, "wrong plays are in the mix, and score 0"


async def test_mcp_token_calls_reach_their_replica_through_the_balancer(balancer: str, cluster: Cluster) -> None:
    """The MCP client sends the session token and no cookie: HAProxy cannot route it; the replica that receives it
    forwards it to the owner the token names."""
    row = example_rows(cluster.root / "resources_servers" / WEATHER)[0]
    answers = await asyncio.gather(*(play_mcp_weather(f"{balancer}/{WEATHER}", row, True) for _ in range(12)))
    assert [answer["reward"] for answer in answers] == [1.0] * 12
    forwarded = 0.0
    for i in REPLICAS:
        text = httpx.get(f"{cluster.address(i)}/metrics", timeout=10).text
        forwarded += sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "http_server_request_duration_seconds_count"
            and sample.labels.get("http_route") == "(forwarded)"
        )
    assert forwarded > 0, "some MCP calls reached a replica that did not hold their session"


async def test_a_drained_replica_loses_no_episode(balancer: str, cluster: Cluster) -> None:
    async def drain_r1() -> None:
        await holding_episodes(cluster, 1)
        cluster.replicas[1].process.send_signal(signal.SIGTERM)

    outcomes = await run(cluster, balancer, 96, 32, think=0.3, during=drain_r1)
    assert all(o.kind == "verdict" and o.right for o in outcomes), summary(outcomes)
    assert "r1" in {o.replica for o in outcomes}, "the drained replica held episodes when it was told to go"
    cluster.replicas[1].process.wait(60)
    cluster.stop(1)
    cluster.start(1)
    await asyncio.to_thread(wait_until, lambda: all_up(balancer), "r1 back behind HAProxy", 30)


async def test_a_killed_replica_costs_only_its_own_episodes(balancer: str, cluster: Cluster) -> None:
    async def kill_r2() -> None:
        await holding_episodes(cluster, 2)
        cluster.replicas[2].process.send_signal(signal.SIGKILL)

    outcomes = await run(cluster, balancer, 96, 32, think=0.3, during=kill_r2)
    check_only_the_victims_lost(outcomes, "r2")
    after = await run(cluster, balancer, 30, 16)
    assert all(o.kind == "verdict" and o.right for o in after), summary(after)
    assert "r2" not in {o.replica for o in after}, "new episodes go to the survivors"
    cluster.stop(2)
    cluster.start(2)
    await asyncio.to_thread(wait_until, lambda: all_up(balancer), "r2 back behind HAProxy", 30)


async def test_a_replica_cut_off_the_network_costs_only_its_own_episodes(balancer: str, cluster: Cluster) -> None:
    async def cut_r3() -> None:
        await holding_episodes(cluster, 3)
        sh("ip", "link", "set", "ghv3", "down")

    try:
        outcomes = await run(cluster, balancer, 96, 32, think=0.3, during=cut_r3)
        check_only_the_victims_lost(outcomes, "r3")
        after = await run(cluster, balancer, 30, 16)
        assert all(o.kind == "verdict" and o.right for o in after), summary(after)
    finally:
        sh("ip", "link", "set", "ghv3", "up")


def check_only_the_victims_lost(outcomes: list[Outcome], victim: str) -> None:
    """Never a genuine-looking score for a lost episode: the victim's end in an error or a masked session_lost;
    everyone else's score right."""
    for outcome in outcomes:
        if outcome.kind == "verdict" and not outcome.right:
            assert outcome.verdict is not None
            assert outcome.verdict.get("mask_sample") is True, f"a lost episode scored as played: {outcome}"
            assert outcome.verdict["failure_kind"] in LOST | {"transport_unreachable"}, outcome
    survivors = [o for o in outcomes if o.replica not in (victim, "?")]
    assert all(o.kind == "verdict" and o.right for o in survivors), summary(survivors)
    lost = [o for o in outcomes if o.replica == victim and not (o.kind == "verdict" and o.right)]
    assert lost, f"{victim} held episodes when it went: {summary(outcomes)}"


def test_the_kubernetes_recipe_drains_within_its_grace_period() -> None:
    import yaml

    documents = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "gymhost.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"] if arg.startswith("--"))
    assert pod["terminationGracePeriodSeconds"] > int(args["drain-timeout"]) + int(args["graceful-timeout"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in container["env"]}
    assert env["GYMHOST_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "gymhost"
    route = next(d for d in documents if d["kind"] == "HTTPRoute")
    assert route["spec"]["rules"][0]["sessionPersistence"]["type"] == "Cookie"
