"""A resources server that calls another Gym server by name (a judge): mapped, unmapped, and mapped but down."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gymhost import EpisodeClient, create_app

from .processes import free_port, gymhost_command, serving, uvicorn_in_a_thread

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

JUDGED_CONFIG = """\
judged:
  resources_servers:
    judged:
      entrypoint: app.py
      domain: agent
      judge_model_server:
        type: responses_api_models
        name: judge_model
"""

JUDGED_APP = """\
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)
from nemo_gym.config_types import ModelServerRef
from nemo_gym.server_utils import get_response_json, raise_for_status


class JudgedConfig(BaseResourcesServerConfig):
    judge_model_server: ModelServerRef


class JudgedServer(SimpleResourcesServer):
    config: JudgedConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        response = await self.server_client.post(
            server_name=self.config.judge_model_server.name, url_path="/v1/responses", json={"input": "grade it"}
        )
        await raise_for_status(response)
        verdict = await get_response_json(response)
        return BaseVerifyResponse(**body.model_dump(), reward=verdict["reward"])


if __name__ == "__main__":
    JudgedServer.run_webserver()
"""

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "be judged"}]}}


@pytest.fixture
def judged_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "judged"
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "judged.yaml").write_text(JUDGED_CONFIG)
    (folder / "app.py").write_text(JUDGED_APP)
    return folder


@pytest.fixture
def judge_url() -> Iterator[str]:
    """A real judge on 127.0.0.1: answers every /v1/responses with reward 0.75."""
    from starlette.applications import Starlette  # nemo-gym's dependency, not the unit tier's
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[dict[str, object]] = []

    async def responses(request: Request) -> JSONResponse:
        seen.append(await request.json())
        return JSONResponse({"reward": 0.75})

    with uvicorn_in_a_thread(Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])) as url:
        yield url
    assert seen, "the judge was never called"


async def _verify(app: object) -> httpx.Response:
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        episode = EpisodeClient("http://gymhost.test", transport=httpx.ASGITransport(app=app), timeout=30)  # type: ignore[arg-type]
        await episode.seed(ROW)
        return await episode.post("/verify", {**ROW, "response": episode.transcript.response("done")})


async def test_a_mapped_judge_is_called_at_its_url(judged_folder: Path, judge_url: str) -> None:
    response = await _verify(create_app(judged_folder, server_urls={"judge_model": judge_url}))
    assert response.status_code == 200, response.text
    assert response.json()["reward"] == 0.75


async def test_an_unmapped_judge_fails_at_once_naming_the_fix(
    judged_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gymhost"):
        app = create_app(judged_folder)
    assert "refers to Gym servers with no URL: judge_model" in caplog.text
    response = await _verify(app)
    assert response.status_code == 500
    message = json.loads(response.text)
    assert message.startswith("UnmappedServerError(")
    assert "'judge_model', which is not mapped to a URL" in message
    assert "--server-url judge_model=URL" in message


async def test_a_mapped_judge_that_is_down_fails_after_a_few_tries(judged_folder: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    response = await _verify(create_app(judged_folder, server_urls={"judge_model": dead}))
    assert response.status_code == 500
    message = json.loads(response.text)
    assert message.startswith("UpstreamUnavailableError(")
    assert f"'judge_model' at {dead}/v1/responses did not answer after 3 tries" in message


async def test_serve_takes_server_urls_on_the_command_line(judged_folder: Path, judge_url: str) -> None:
    command = gymhost_command("serve", str(judged_folder), "--port", "0", "--server-url", f"judge_model={judge_url}")
    with serving(command) as process:
        async with EpisodeClient(process.url) as episode:
            await episode.seed(ROW)
            assert (await episode.verify(ROW, "done"))["reward"] == 0.75


async def test_a_judge_that_answers_an_error_is_reported_as_gym_reports_it(judged_folder: Path) -> None:
    """Gym's exception middleware answer for a failed inner call, kept by gymhost's pure-ASGI replacement."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def broken(request: object) -> PlainTextResponse:
        return PlainTextResponse("judge overloaded", status_code=503)

    with uvicorn_in_a_thread(Starlette(routes=[Route("/v1/responses", broken, methods=["POST"])])) as url:
        response = await _verify(create_app(judged_folder, server_urls={"judge_model": url}))
    assert response.status_code == 500
    assert json.loads(response.text) == (
        "Hit an exception in JudgedServer___judged calling an inner server: b'judge overloaded'"
    )
