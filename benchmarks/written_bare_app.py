"""The practical limit of a written server's tool call: a bare Starlette endpoint that makes the call on an
in-process gridsim instance the way a written server calls one (a tool session on its MCP server object,
``DirectToolSession``), and answers the tool's text, on uvicorn. The instance is seeded with the first task of the
bundle, as an episode's would be; no session cookie, episode state, time limit, metrics or middleware.
`python benchmarks/written_bare_app.py BUNDLE PORT`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gymhost.environments._agentenv._launchers import InProcessLauncher
from gymhost.environments._settings import PoolSettings
from gymhost.environments._tasks import load_task_folder

BUNDLE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bundle")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    launcher = InProcessLauncher(BUNDLE)
    instance = await launcher.launch(0, PoolSettings())
    catalog = await instance.client.describe()
    task = next(iter(load_task_folder(BUNDLE / "tasks").values()))[0]
    await instance.client.clear()
    await instance.client.begin(task)
    app.state.session = await instance.client.tool_session(catalog, role=None, timeout=60).open()
    yield
    await app.state.session.close()
    await launcher.stop(instance)


async def call_tool(request: Request) -> PlainTextResponse:
    raw = await request.body()
    arguments = json.loads(raw) if raw.strip() else {}
    result = await request.app.state.session.call_tool(request.path_params["name"], arguments)
    return PlainTextResponse(result.text, status_code=400 if result.isError else 200)


async def liveness(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/", liveness), Route("/{name}", call_tool, methods=["POST"])], lifespan=lifespan)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
