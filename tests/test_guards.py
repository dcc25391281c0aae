"""The bearer token and the request bounds on real Gym apps: create_app, a gateway, and `gymhost serve`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymhost import NO_TOKEN, EpisodeClient, create_app, create_gateway

from .gym_plays import example_rows
from .processes import CALL_TIMEOUT_S, gymhost_command, run_to_completion, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BASE = "http://gymhost.test"
TOKEN = "tok-6f1c2a9e0b7d4c3a"
SECRET = "secret-0d9e8c7b6a5f"
EXAMPLE = "example_single_tool_call"


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_create_app_checks_the_token_on_every_route_but_liveness(gym_root: Path) -> None:
    app = create_app(gym_root / EXAMPLE, token=TOKEN)
    row = example_rows(gym_root / EXAMPLE)[0]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            assert (await client.get("/")).json() == {"status": "ok"}  # a probe sends no credentials
            for path in ("/seed_session", "/verify", "/get_weather", "/mcp"):
                refused = await client.post(path, json=row)
                assert (refused.status_code, refused.headers["www-authenticate"]) == (401, "Bearer"), path
            assert (await client.get("/openapi.json")).status_code == 401
            assert (await client.post("/seed_session", json=row, headers=bearer("guess"))).status_code == 401
            seeded = await client.post("/seed_session", json=row, headers=bearer())
            assert seeded.status_code == 200


async def test_gymhost_token_in_the_environment_protects_apps_built_without_one(
    gym_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYMHOST_TOKEN", TOKEN)
    app = create_app(gym_root / EXAMPLE)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        assert (await client.post("/seed_session", json={})).status_code == 401
    opted_out = create_app(gym_root / EXAMPLE, token=NO_TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=opted_out), base_url=BASE) as client:
        assert (await client.get("/openapi.json")).status_code == 200


async def test_a_gateway_guards_its_index_and_every_mount_and_leaves_probes_open(gym_root: Path) -> None:
    gateway = create_gateway({"/a": gym_root / EXAMPLE, "/b": gym_root / EXAMPLE}, token=TOKEN)
    row = example_rows(gym_root / EXAMPLE)[0]
    transport = httpx.ASGITransport(app=gateway)
    async with (
        gateway.router.lifespan_context(gateway),
        httpx.AsyncClient(transport=transport, base_url=BASE) as client,
    ):
        for probe in ("/health", "/a/", "/b/"):
            assert (await client.get(probe)).status_code == 200, probe
        assert (await client.get("/")).status_code == 401  # the index lists servers and tools
        assert (await client.post("/a/seed_session", json=row)).status_code == 401
        assert (await client.post("/b/seed_session", json=row, headers=bearer())).status_code == 200
        assert [s["prefix"] for s in (await client.get("/", headers=bearer())).json()["servers"]] == ["/a", "/b"]


async def test_bad_bodies_are_refused_with_json_and_the_episode_beside_them_goes_on(gym_root: Path) -> None:
    folder = gym_root / EXAMPLE
    app = create_app(folder, max_body_bytes=64 * 1024, max_json_depth=32)
    row = example_rows(folder)[0]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(row)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, cookies=episode.cookies) as client:
            cases = {
                "huge": (json.dumps({**row, "pad": "x" * 70_000}).encode(), 413),
                "deep": (b'{"a":' * 40 + b"1" + b"}" * 40, 400),
                "surrogate": (json.dumps({**row, "x": "\ud800"}).encode(), 400),
                "not json": (b"{'single': 'quotes'}", 422),  # FastAPI's own answer to malformed JSON
            }
            for name, (body, status) in cases.items():
                answer = await client.post("/verify", content=body, headers={"content-type": "application/json"})
                assert answer.status_code == status, name
                assert isinstance(answer.json()["detail"], str | list), name
        output = await episode.call_tool("get_weather", {"city": "Paris"})
        assert output.ok
        assert "reward" in await episode.verify(row)


def test_serve_with_a_token_refuses_strangers_and_never_logs_the_token_or_the_secret(gym_root: Path) -> None:
    env = {"GYMHOST_TOKEN": TOKEN, "GYMHOST_SECRET": SECRET}
    command = gymhost_command("serve", str(gym_root / EXAMPLE), "--port", "0", "--log-level", "debug", "--access-log")
    with serving(command, env=env) as server:
        row = example_rows(gym_root / EXAMPLE)[0]
        assert httpx.post(f"{server.url}/seed_session", json=row, timeout=CALL_TIMEOUT_S).status_code == 401
        seeded = httpx.post(f"{server.url}/seed_session", json=row, headers=bearer(), timeout=CALL_TIMEOUT_S)
        assert seeded.status_code == 200
        assert (
            httpx.post(
                f"{server.url}/seed_session", json=row, headers=bearer("wrong"), timeout=CALL_TIMEOUT_S
            ).status_code
            == 401
        )
    assert TOKEN not in server.output, server.output
    assert SECRET not in server.output, server.output


def test_serve_beyond_loopback_without_a_token_is_refused_unless_told(gym_root: Path) -> None:
    """192.0.2.1 is a documentation address no machine has: the refusal comes before binding, and with a token or
    --no-token binding is what fails, so the test never listens beyond loopback."""
    refused = run_to_completion(gymhost_command("serve", str(gym_root / EXAMPLE), "--host", "192.0.2.1"))
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("Error: serving on 192.0.2.1 with no token would let anyone"), line
    assert "set GYMHOST_TOKEN (or --token), serve on 127.0.0.1, or pass --no-token" in line
    told = run_to_completion(gymhost_command("serve", str(gym_root / EXAMPLE), "--host", "192.0.2.1", "--no-token"))
    assert "gymhost: serving on 192.0.2.1 with no token (--no-token)" in told.stdout, told.stdout + told.stderr
    assert "192.0.2.1 is not an address of this machine" in told.stderr
    quiet = run_to_completion(
        gymhost_command("serve", str(gym_root / EXAMPLE), "--host", "192.0.2.1", "--token", TOKEN)
    )
    assert "192.0.2.1 is not an address of this machine" in quiet.stderr
    assert "with no token" not in quiet.stdout + quiet.stderr
    assert TOKEN not in quiet.stdout + quiet.stderr
    both = run_to_completion(
        gymhost_command("serve", str(gym_root / EXAMPLE), "--host", "192.0.2.1", "--token", TOKEN, "--no-token")
    )
    assert both.returncode == 2
    assert "--no-token and a token" in both.stderr
