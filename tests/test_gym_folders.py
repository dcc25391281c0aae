"""Gym's folders served as Gym's launcher runs them: in their own directory, with ``env.yaml`` read, and the episodes
of Gymnasium-style servers (``/reset``, ``/step``) followed as seeds and verifies are."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymhost import create_app, create_gateway
from gymhost._exceptions import FolderError
from gymhost._hosting._lifespan import running_lifespan

from .processes import CALL_TIMEOUT_S, assert_stopped_cleanly, gymhost_command, serving, uvicorn_in_a_thread

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

# A server that reads files relative to its folder, at build (a prompt template, as equivalence_llm_judge does) and
# while it serves (a tool), and takes a value from env.yaml through its config.
READER_CONFIG = """\
reader:
  resources_servers:
    reader:
      entrypoint: app.py
      domain: other
      template_fpath: prompt_templates/judge.txt
      judge_url: ${policy_base_url}
"""

READER_APP = """\
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)


class ReaderConfig(BaseResourcesServerConfig):
    template_fpath: str
    judge_url: str


class ReaderServer(SimpleResourcesServer):
    config: ReaderConfig

    def model_post_init(self, context):
        super().model_post_init(context)
        with open(self.config.template_fpath) as template:  # relative: Gym runs the server in its folder
            self._template = template.read().strip()

    def setup_webserver(self):
        app = super().setup_webserver()
        app.post("/read")(self.read)
        return app

    async def read(self) -> dict:
        with open("data/greeting.txt") as greeting:  # relative, while it serves
            return {"template": self._template, "greeting": greeting.read().strip(), "judge": self.config.judge_url}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    ReaderServer.run_webserver()
"""

# A Gymnasium-style server: each episode counts down from 3, a step a number, and terminates at 0.
COUNTDOWN_CONFIG = """\
countdown:
  resources_servers:
    countdown:
      entrypoint: app.py
      domain: other
"""

COUNTDOWN_APP = """\
from fastapi import FastAPI, Request
from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer
from nemo_gym.server_utils import SESSION_ID_KEY


class CountdownServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig
    left: dict = {}

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.post("/reset")(self.reset)
        app.post("/step")(self.step)
        return app

    async def reset(self, request: Request) -> dict:
        self.left[request.session[SESSION_ID_KEY]] = 3
        return {"observation": "3", "info": {}}

    async def step(self, request: Request) -> dict:
        session = request.session[SESSION_ID_KEY]
        self.left[session] -= 1
        return {"observation": str(self.left[session]), "reward": 0.5, "terminated": self.left[session] == 0,
                "truncated": False, "info": {}}

    async def verify(self, body):
        raise NotImplementedError("a Gymnasium-style server steps instead")


if __name__ == "__main__":
    CountdownServer.run_webserver()
"""


def folder_of(root: Path, name: str, app: str, config: str, files: dict[str, str] | None = None) -> Path:
    folder = root / "resources_servers" / name
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / f"{name}.yaml").write_text(config)
    (folder / "app.py").write_text(app)
    for path, text in (files or {}).items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def reader(root: Path) -> Path:
    files = {"prompt_templates/judge.txt": "Judge it.", "data/greeting.txt": "hello"}
    return folder_of(root, "reader", READER_APP, READER_CONFIG, files)


def test_a_server_is_built_in_its_folder_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its build opens a template relative to its folder, its config takes policy_base_url from the Gym root's
    env.yaml; called from elsewhere, create_app builds it, says which env.yaml it read (its keys, not their values),
    and leaves the working directory where it was."""
    folder = reader(tmp_path / "gym")
    (tmp_path / "gym" / "env.yaml").write_text("policy_base_url: http://policy.internal:8000\npolicy_api_key: s3cret\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with caplog.at_level(logging.INFO, logger="gymhost"):
        app = create_app(folder)
    assert Path.cwd() == elsewhere
    server = app.state.gymhost.server
    assert (server._template, server.config.judge_url) == ("Judge it.", "http://policy.internal:8000")
    read = [record.getMessage() for record in caplog.records if "env.yaml" in record.getMessage()]
    assert read == [f"reader: read {tmp_path / 'gym' / 'env.yaml'} (policy_api_key, policy_base_url)"], read
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("name", ["equivalence_llm_judge", "gdp_pdf", "labbench2_vlm", "xstest"])
def test_gyms_servers_that_read_files_of_their_folder_build_from_anywhere(
    name: str, gym_root: Path, gym_version: tuple[int, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Published folders whose build opens prompt_templates/... relative to the working directory (Gym runs them in
    their folder). The other Gym servers they call are mapped to a stand-in that answers anything: xstest waits, as
    it is built, until its judge answers, reading the judge's address from its own config as Gym gives it."""
    if not (gym_root / name).is_dir():
        assert (name, gym_version) == ("gdp_pdf", (0, 4)), f"{name} is published in every supported version but 0.4.0"
        return
    from gymhost._hosting._folder import load_server_spec
    from gymhost._hosting._server_client import referenced_servers

    monkeypatch.chdir(tmp_path)
    folder = gym_root / name
    with uvicorn_in_a_thread(Starlette(routes=[Route("/{path:path}", _anything, methods=["GET", "POST"])])) as peer:
        urls = dict.fromkeys(referenced_servers(load_server_spec(folder).block), peer)
        app = create_app(folder, server_urls=urls)
    assert app.state.gymhost.spec.folder == folder
    assert Path.cwd() == tmp_path


async def _anything(request: Any) -> JSONResponse:
    return JSONResponse({})


def test_env_yaml_is_found_where_gyms_launcher_looks_and_a_missing_value_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = reader(tmp_path / "gym")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FolderError, match=r"Interpolation key 'policy_base_url' not found.*found no env\.yaml"):
        create_app(folder)
    (tmp_path / "env.yaml").write_text("policy_base_url: http://from-the-working-directory\n")  # before the Gym root
    (tmp_path / "gym" / "env.yaml").write_text("policy_base_url: http://from-the-gym-root\n")
    assert create_app(folder).state.gymhost.server.config.judge_url == "http://from-the-working-directory"
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "env.yaml").write_text("policy_base_url: http://from-an-extra-root\n")
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(extra))
    assert create_app(folder).state.gymhost.server.config.judge_url == "http://from-an-extra-root"
    assert create_app(folder, judge_url="http://given").state.gymhost.server.config.judge_url == "http://given"


def test_gymhost_serve_runs_one_folder_in_it(tmp_path: Path) -> None:
    """A file opened by a relative path while the server serves is the folder's, as under Gym's launcher."""
    folder = reader(tmp_path / "gym")
    (tmp_path / "gym" / "env.yaml").write_text("policy_base_url: http://policy\n")
    with serving(gymhost_command("serve", str(folder), "--port", "0"), cwd=tmp_path) as server:
        answer = httpx.post(f"{server.url}/read", json={}, timeout=CALL_TIMEOUT_S).json()
    assert answer == {"template": "Judge it.", "greeting": "hello", "judge": "http://policy"}
    assert_stopped_cleanly(server)


def countdown(root: Path) -> Path:
    return folder_of(root, "countdown", COUNTDOWN_APP, COUNTDOWN_CONFIG)


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{wanted}}} in:\n{text}")


async def until(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def test_a_gymnasium_style_episode_is_followed_from_reset_to_its_last_step(tmp_path: Path) -> None:
    """Under a prefix: a reset opens an episode, a terminating step ends it rewarded with its steps' sum."""
    gateway = create_gateway({"/countdown": countdown(tmp_path)})
    async with running_lifespan(gateway):
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gym") as client:

            async def open_episodes(count: int) -> bool:
                text = (await client.get("/countdown/metrics")).text
                return metric(text, "gymhost_episodes_open", mount="/countdown") == count

            assert (await client.post("/countdown/reset", json={})).json() == {"observation": "3", "info": {}}
            await until(lambda: open_episodes(1), "the reset opened an episode")
            for left in (2, 1, 0):
                step = (await client.post("/countdown/step", json={})).json()
                assert (step["observation"], step["terminated"]) == (str(left), left == 0)
            await until(lambda: open_episodes(0), "the terminating step ended it")
            text = (await client.get("/countdown/metrics")).text
    assert metric(text, "gymhost_episodes_ended_total", mount="/countdown", outcome="rewarded") == 1
    assert metric(text, "gymhost_reward_sum", mount="/countdown") == 1.5
    assert metric(text, "gymhost_sessions_started_total", mount="/countdown") == 1


async def test_a_drain_waits_for_a_gymnasium_episode_and_takes_no_new_one(tmp_path: Path) -> None:
    folder = countdown(tmp_path)
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--drain-timeout", "60")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT_S) as client:
            await client.post("/reset", json={})
            # The drain reads the same live count as the gauge: both say 1 now, with no wait.
            metrics = (await client.get("/metrics")).text
            assert metric(metrics, "gymhost_episodes_open", mount="/") == 1
            server.process.send_signal(signal.SIGTERM)
            await until(lambda: _refused(client), "the drain refuses new episodes")
            assert server.process.poll() is None, "the drain waits for the open episode"
            for _ in range(3):
                assert (await client.post("/step", json={})).status_code == 200
            server.process.wait(30)
    assert_stopped_cleanly(server)


async def _refused(client: httpx.AsyncClient) -> bool:
    other = httpx.AsyncClient(base_url=client.base_url, timeout=CALL_TIMEOUT_S)  # a new client: a new session
    async with other:
        return (await other.post("/reset", json={})).status_code == 503


async def test_a_gymnasium_step_on_another_replica_is_answered_as_lost(tmp_path: Path) -> None:
    folder = countdown(tmp_path)
    secret = {"GYMHOST_SECRET": "one-secret-for-both"}
    with (
        serving(gymhost_command("serve", str(folder), "--port", "0", "--replica-id", "a"), env=secret) as first,
        serving(gymhost_command("serve", str(folder), "--port", "0", "--replica-id", "b"), env=secret) as second,
    ):
        async with httpx.AsyncClient(base_url=first.url, timeout=CALL_TIMEOUT_S) as client:
            await client.post("/reset", json={})
            cookies = client.cookies
        async with httpx.AsyncClient(base_url=second.url, cookies=cookies, timeout=CALL_TIMEOUT_S) as elsewhere:
            lost = await elsewhere.post("/step", json={})
            assert lost.status_code == 410
            assert lost.json()["failure_kind"] == "session_lost"
            reset = await elsewhere.post("/reset", json={})
            assert reset.status_code == 200, "a reset on another replica starts a new episode there"
