"""A client that disconnects cancels its request's handler (nemo-gym 0.5+ behaviour, kept by gymhost), and fast
requests are not touched."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from .processes import CALL_TIMEOUT_S, STATE_TIMEOUT_S, gymhost_command, serving
from .test_folder_errors import CONFIG, make_folder

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

SLOW_SERVER = """\
import asyncio

import anyio
from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)


class Wait(BaseModel):
    seconds: float


class SlowServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig
    counts: dict[str, int] = {"started": 0, "finished": 0, "cancelled": 0, "cleaned_up": 0}

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/wait")(self.wait)
        app.post("/counts")(self.read_counts)
        return app

    async def wait(self, body: Wait) -> dict[str, float]:
        self.counts["started"] += 1
        try:
            await asyncio.sleep(body.seconds)
        except asyncio.CancelledError:
            self.counts["cancelled"] += 1
            with anyio.CancelScope(shield=True):  # cleanup a handler protects from cancellation finishes
                await asyncio.sleep(0.2)
                self.counts["cleaned_up"] += 1
            raise
        self.counts["finished"] += 1
        return {"waited": body.seconds}

    async def read_counts(self) -> dict[str, int]:
        return self.counts

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    SlowServer.run_webserver()
"""


async def test_a_client_that_gives_up_cancels_the_handler(tmp_path: Path, gym_version: tuple[int, ...]) -> None:
    folder = make_folder(tmp_path, name="slow", config=CONFIG.format(key="slow", name="slow"), app=SLOW_SERVER)
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT_S) as client:
            for seconds in (0.0, 0.05, 0.3):  # fast ones and one that outlives the 0.1 s before watching starts
                assert (await client.post("/wait", json={"seconds": seconds})).json() == {"waited": seconds}
        async with httpx.AsyncClient(base_url=server.url, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post("/wait", json={"seconds": 5})
        deadline = time.monotonic() + STATE_TIMEOUT_S
        async with httpx.AsyncClient(base_url=server.url, timeout=CALL_TIMEOUT_S) as client:
            while time.monotonic() < deadline:
                counts = (await client.post("/counts", json={})).json()
                if counts["cleaned_up"] or gym_version < (0, 5):
                    break
                await asyncio.sleep(0.1)
    if gym_version >= (0, 5):  # nemo-gym 0.5+ cancels on disconnect; gymhost keeps that, on plain asyncio
        assert counts == {"started": 4, "finished": 3, "cancelled": 1, "cleaned_up": 1}
    else:  # 0.4.0 never did: the handler runs to its end
        assert counts["cancelled"] == 0
