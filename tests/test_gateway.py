"""Many servers in one process: mounted under prefixes, sessions apart, lifespans run, as real processes too."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from base64 import b64decode, b64encode
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Mount

from gymhost import GatewayError, create_app, create_gateway, load_app, mounted_lifespan
from gymhost.environments import Task, load_tasks, write_folder

from .agentenv_helpers import GRIDSIM, rows
from .conftest import REPO
from .gym_plays import example_rows, play_mcp_weather
from .processes import CALL_TIMEOUT_S, free_port, gymhost_command, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BASE = "http://gateway.test"
TASKS: dict[str, Task] = {task.id: task for task in load_tasks(GRIDSIM / "tasks" / "eval.jsonl")}
COUNTER = "example_session_state_mgmt"
COUNTER_COOKIE = "StatefulCounterResourcesServer___example_session_state_mgmt_resources_server"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, gym_root: Path) -> Path:
    """A Gym root with two written gridsim servers and a copy of one of nemo-gym's own examples."""
    root = tmp_path_factory.mktemp("root")
    for name in ("gridsim_a", "gridsim_b"):
        write_folder(str(GRIDSIM), root, name=name, instances=2)
    shutil.copytree(gym_root / COUNTER, root / "resources_servers" / COUNTER)
    return root


@asynccontextmanager
async def running(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan, and one client with one cookie jar, as a browser-like caller has."""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client,
    ):
        yield client


async def play_gridsim(client: httpx.AsyncClient, prefix: str, row: dict[str, Any]) -> float:
    """Through the shared client: its jar keeps each mount's cookie for that mount's path only."""
    solution = TASKS[row["task_id"]].solution
    assert solution is not None
    assert (await client.post(f"{prefix}/seed_session", json=row)).status_code == 200
    for call in solution.tool_calls:
        reply = await client.post(f"{prefix}/{call.name}", json=call.arguments)
        assert reply.status_code == 200, reply.text
    response = {"id": "r", "object": "response", "created_at": 0, "model": "m", "output": [], "tools": [],
                "parallel_tool_calls": True, "tool_choice": "auto"}  # fmt: skip
    verdict = await client.post(f"{prefix}/verify", json={**row, "response": response})
    return float(verdict.json()["reward"])


async def play_counter(client: httpx.AsyncClient, prefix: str, row: dict[str, Any], add: int) -> int:
    assert (await client.post(f"{prefix}/seed_session", json=row)).status_code == 200
    for _ in range(add):
        await asyncio.sleep(0)  # let the other mounts' episodes interleave
        assert (await client.post(f"{prefix}/increment_counter", json={"count": 1})).status_code == 200
    return int((await client.post(f"{prefix}/get_counter_value", json={})).json()["count"])


async def test_a_gateway_of_your_own_mounts_servers_and_plays_them_concurrently(root: Path, gym_root: Path) -> None:
    from fastapi import FastAPI

    servers = root / "resources_servers"
    gateway = FastAPI(lifespan=mounted_lifespan)

    @gateway.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"pong": True}

    gateway.mount("/grid_a", create_app(servers / "gridsim_a"))
    gateway.mount("/grid_b", create_app(servers / "gridsim_b"))
    gateway.mount("/counter", create_app(servers / COUNTER))
    gateway.mount("/weather", create_app(gym_root / "example_mcp_weather"))
    counter_row = example_rows(gym_root / COUNTER)[0]
    async with running(gateway) as client:
        assert (await client.get("/ping")).json() == {"pong": True}
        rewards_a, rewards_b, count, weather = await asyncio.gather(
            asyncio.gather(*(play_gridsim(client, "/grid_a", row) for row in rows(servers / "gridsim_a")[:2])),
            asyncio.gather(*(play_gridsim(client, "/grid_b", row) for row in rows(servers / "gridsim_b")[2:4])),
            play_counter(client, "/counter", counter_row, add=5),
            play_mcp_weather(
                f"{BASE}/weather", example_rows(gym_root / "example_mcp_weather")[0], True, client._transport
            ),
        )
        assert rewards_a == rewards_b == [1.0, 1.0]
        assert count == counter_row["initial_count"] + 5
        assert weather["reward"] == 1.0  # MCP through the /weather prefix: url_path joined onto the mount
        paths = {cookie.name: cookie.path for cookie in client.cookies.jar}
        assert paths[COUNTER_COOKIE] == "/counter"
        assert paths["GridsimAResourcesServer___gridsim_a_resources_server"] == "/grid_a"


def test_load_app_gives_a_gateway_for_a_root_and_an_app_for_a_folder(root: Path) -> None:
    """The one loader behind `gymhost serve PATH` and `GYMHOST_FOLDER=PATH uvicorn asgi:app`."""
    gateway = load_app(root)
    assert sorted(route.path for route in gateway.router.routes if isinstance(route, Mount)) == [
        f"/{COUNTER}",
        "/gridsim_a",
        "/gridsim_b",
    ]
    single = load_app(root / "resources_servers" / "gridsim_a", address=("127.0.0.1", 8123))
    assert single.state.gymhost.server.config.port == 8123
    with pytest.raises(GatewayError, match="apply to one server's folder"):
        load_app(root, idle_timeout_s=5)


async def test_create_gateway_on_a_root_lists_servers_and_their_tools(root: Path) -> None:
    gateway = create_gateway(root)
    async with running(gateway) as client:
        index = (await client.get("/")).json()
        listed = {server["prefix"]: server for server in index["servers"]}
        assert sorted(listed) == ["/example_session_state_mgmt", "/gridsim_a", "/gridsim_b"]
        assert listed["/gridsim_a"]["tools"] == ["gridsim_look", "gridsim_move"]
        assert listed["/gridsim_a"]["name"] == "gridsim_a_resources_server"
        assert listed[f"/{COUNTER}"]["tools"] == ["get_counter_value", "increment_counter"]


async def test_the_same_folder_mounted_twice_keeps_two_sessions(gym_root: Path) -> None:
    folder = gym_root / COUNTER
    gateway = create_gateway({"/c1": folder, "/c2": folder})
    row = example_rows(folder)[0]
    async with running(gateway) as client:
        counts = await asyncio.gather(play_counter(client, "/c1", row, add=2), play_counter(client, "/c2", row, add=7))
        assert counts == [row["initial_count"] + 2, row["initial_count"] + 7]
        cookies = sorted((c.name, c.path) for c in client.cookies.jar)
        assert cookies == [(COUNTER_COOKIE, "/c1"), (COUNTER_COOKIE, "/c2")]
        # One mount's cookie sent to the other starts a new session there: the signature is salted with the mount.
        c1_cookie = next(c.value for c in client.cookies.jar if c.path == "/c1")
        foreign = await client.post(
            "/c2/get_counter_value", json={}, headers={"cookie": f"{COUNTER_COOKIE}={c1_cookie}"}
        )
        assert foreign.json()["count"] == 0


async def test_a_cookie_signed_with_gyms_public_key_is_refused(gym_root: Path) -> None:
    import itsdangerous

    folder = gym_root / COUNTER
    app = create_app(folder)
    row = example_rows(folder)[0]
    async with running(app) as client:
        assert await play_counter(client, "", row, add=1) == row["initial_count"] + 1
        genuine = client.cookies[COUNTER_COOKIE]
        session = json.loads(b64decode(genuine.split(".")[0] + "=="))
        forged = itsdangerous.TimestampSigner(COUNTER_COOKIE).sign(b64encode(json.dumps(session).encode())).decode()
        client.cookies.clear()
        answer = await client.post("/get_counter_value", json={}, headers={"cookie": f"{COUNTER_COOKIE}={forged}"})
        assert answer.json()["count"] == 0  # not the session it names
        reissued = answer.cookies[COUNTER_COOKIE]
        assert json.loads(b64decode(reissued.split(".")[0] + "=="))["session_id"] != session["session_id"]
        kept = await client.post("/get_counter_value", json={}, headers={"cookie": f"{COUNTER_COOKIE}={genuine}"})
        assert kept.json()["count"] == row["initial_count"] + 1


async def test_what_a_root_server_has_also_works_under_a_prefix(gym_root: Path, gym_version: tuple[int, ...]) -> None:
    folder = gym_root / COUNTER
    async with running(create_gateway({"/c": folder})) as client:
        assert (await client.get("/c/")).json() == {"status": "ok"}
        redirect = await client.get("/c")
        assert (redirect.status_code, redirect.headers["location"]) == (307, f"{BASE}/c/")
        slash = await client.post("/c/verify/", json={})
        assert (slash.status_code, slash.headers["location"]) == (307, f"{BASE}/c/verify")
        openapi = (await client.get("/c/openapi.json")).json()
        assert openapi["servers"] == [{"url": "/c"}]
        assert "/increment_counter" in openapi["paths"]
        assert "/c/openapi.json" in (await client.get("/c/docs")).text
        row = example_rows(folder)[0]
        await client.post("/c/seed_session", json=row)
        if gym_version >= (0, 5):
            assert (await client.get("/c/healthz")).json() == {"status": "ok"}
            # nemo-gym 0.5+ rollout correlation: /ng-rollout/<id>/ in front of any path, here below the prefix.
            rolled = await client.post("/c/ng-rollout/task-3/increment_counter", json={"count": 4})
            assert rolled.status_code == 200, rolled.text
        else:
            await client.post("/c/increment_counter", json={"count": 4})
        assert (await client.post("/c/get_counter_value", json={})).json()["count"] == row["initial_count"] + 4


def test_folders_sharing_a_sibling_module_name_each_get_their_own(tmp_path: Path) -> None:
    from .test_folder_errors import SERVER, make_folder

    apps = {}
    for name, greeting in (("first", "hello"), ("second", "bonjour")):
        folder = make_folder(tmp_path / name, name=name)
        (folder / "helpers.py").write_text(f"GREETING = {greeting!r}\n")
        (folder / "app.py").write_text("from helpers import GREETING\n" + SERVER.replace('"hello"', "GREETING"))
        apps[name] = folder
    gateway = create_gateway({f"/{name}": folder for name, folder in apps.items()})
    mounts = [route for route in gateway.router.routes if isinstance(route, Mount)]
    greetings = {mount.path: mount.app.state.gymhost.server.config.greeting for mount in mounts}
    assert greetings == {"/first": "hello", "/second": "bonjour"}


def test_folders_whose_requirements_conflict_are_refused(tmp_path: Path) -> None:
    from .test_folder_errors import make_folder

    first, second = make_folder(tmp_path / "a", name="first"), make_folder(tmp_path / "b", name="second")
    (first / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\nclick>=8\n")
    (second / "requirements.txt").write_text("click<1.0\n")
    with pytest.raises(
        GatewayError, match=r"cannot share one process: /second needs click<1\.0, but click \S+ is what /first run"
    ):
        create_gateway({"/first": first, "/second": second})


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_gymhost_serve_a_root_as_a_real_process(root: Path, gym_root: Path, server: str) -> None:
    with serving(gymhost_command("serve", str(root), "--port", "0", "--server", server)) as process:
        assert "(servers: /example_session_state_mgmt, /gridsim_a, /gridsim_b)" in process.output
        async with httpx.AsyncClient(base_url=process.url, timeout=CALL_TIMEOUT_S) as client:
            rewards = await asyncio.gather(
                play_gridsim(client, "/gridsim_a", rows(root / "resources_servers" / "gridsim_a")[8]),
                play_gridsim(client, "/gridsim_b", rows(root / "resources_servers" / "gridsim_b")[9]),
                play_counter(client, f"/{COUNTER}", example_rows(gym_root / COUNTER)[1], add=3),
            )
            assert rewards[:2] == [1.0, 1.0]
            assert rewards[2] == example_rows(gym_root / COUNTER)[1]["initial_count"] + 3


async def test_asgi_module_serves_a_root(root: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "asgi:app", "--port", str(port)]
    with serving(command, cwd=REPO, env={"GYMHOST_FOLDER": str(root)}, url=url):
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S) as client:
            assert len((await client.get("/")).json()["servers"]) == 3
            assert await play_gridsim(client, "/gridsim_a", rows(root / "resources_servers" / "gridsim_a")[0]) == 1.0


async def test_asgi_module_serves_several_folders_as_gymhost_serve_does(root: Path) -> None:
    """GYMHOST_FOLDER read alike by both: folders separated by spaces, each served at /<name>."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    servers = root / "resources_servers"
    command = [sys.executable, "-m", "uvicorn", "asgi:app", "--port", str(port)]
    folders = f"{servers / 'gridsim_a'} {servers / 'gridsim_b'}"
    with serving(command, cwd=REPO, env={"GYMHOST_FOLDER": folders}, url=url):
        async with httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S) as client:
            assert [server["prefix"] for server in (await client.get("/")).json()["servers"]] == [
                "/gridsim_a",
                "/gridsim_b",
            ]
            assert await play_gridsim(client, "/gridsim_b", rows(servers / "gridsim_b")[0]) == 1.0


async def test_an_mcp_token_of_one_server_is_no_token_at_another(gym_root: Path) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    folder = gym_root / "example_mcp_weather"
    gateway = create_gateway({"/a": create_app(folder, name="weather_a"), "/b": create_app(folder, name="weather_b")})
    row = example_rows(folder)[0]

    async def get_weather(prefix: str, headers: dict[str, str], transport: Any) -> Any:
        async with (
            httpx.AsyncClient(transport=transport, headers=headers) as http,
            streamable_http_client(f"{BASE}{prefix}/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await session.call_tool("get_weather", {"city": "Paris"})

    async with running(gateway) as client:
        transport = client._transport
        token_a = (await client.post("/a/seed_session", json=row)).json()["mcp"]["headers"]
        token_b = (await client.post("/b/seed_session", json=row)).json()["mcp"]["headers"]
        assert not (await get_weather("/a", token_a, transport)).isError
        assert not (await get_weather("/b", token_b, transport)).isError
        refused = await get_weather("/b", token_a, transport)
        assert refused.isError
        text = refused.content[0].text  # type: ignore[union-attr]
        assert "Invalid Gym MCP session token" in text or "X-NeMo-Gym-Session-Token" in text


def test_bundles_sharing_a_sibling_module_name_each_get_their_own(tmp_path: Path) -> None:
    from .agentenv_helpers import make_bundle

    apps = {}
    for name in ("alpha", "beta"):
        bundle = make_bundle(tmp_path / name, name=f"{name}_v1")
        (bundle / "helpers.py").write_text(f"NAME = {name!r}\n")
        env = (bundle / "env.py").read_text()
        env = env.replace('@environment_card(name="counter")', "@environment_card(name=NAME)")
        (bundle / "env.py").write_text("from helpers import NAME\n" + env)
        written = write_folder(str(bundle), tmp_path / "root", mode="in-process", instances=1)
        apps[f"/{name}"] = written.path

    async def names() -> list[str]:
        gateway = create_gateway(apps)
        async with running(gateway) as client:
            return [(await client.get(f"{prefix}/agentenv/pool")).json()["environment"] for prefix in apps]

    assert asyncio.run(names()) == ["alpha", "beta"]


def test_a_root_with_a_folder_needing_its_own_venv_is_refused_under_workers(tmp_path: Path, gym_root: Path) -> None:
    """Each worker would start its own process for such a folder, and the sessions of a request reaching the other
    worker would be lost: refused at start, with what to do instead, before any venv is built."""
    from .processes import run_to_completion

    folder = tmp_path / "resources_servers" / "example_single_tool_call"
    shutil.copytree(gym_root / "example_single_tool_call", folder)
    (folder / "requirements.txt").write_text("gymhost-test-package-nobody-has==1.0\n")
    venvs = tmp_path / "venvs"
    command = gymhost_command("serve", str(tmp_path), "--venv", "--workers", "2", "--port", "0")
    result = run_to_completion(["env", f"GYMHOST_VENV_DIR={venvs}", *command])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "/example_single_tool_call: example_single_tool_call needs a venv of its own" in result.stderr
    assert "Serve this Gym root with one worker" in result.stderr
    assert not venvs.exists(), "refused before a venv was built"
    assert "Traceback" not in result.stderr
