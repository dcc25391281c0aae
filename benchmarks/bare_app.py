"""The practical limit: a bare Starlette endpoint doing what example_single_tool_call's tool does, on uvicorn.

It parses the JSON body, builds the same answer and returns it; no sessions, no middleware, no validation.
`python benchmarks/bare_app.py PORT`.
"""

from __future__ import annotations

import json
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def get_weather(request: Request) -> JSONResponse:
    city = json.loads(await request.body())["city"]
    return JSONResponse({"city": city, "weather_description": f"The weather in {city} is cold."})


async def liveness(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/get_weather", get_weather, methods=["POST"]), Route("/", liveness)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
