"""FastAPI's own floor: the same tool as example_single_tool_call (the same pydantic request and response models),
as a plain FastAPI route with no middleware, on uvicorn. Every Gym server is a FastAPI app, so no way of serving
one can be faster than this; it shows how much of the distance to the bare Starlette endpoint is FastAPI's.
`python benchmarks/fastapi_app.py PORT`.
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel


class GetWeatherRequest(BaseModel):
    city: str


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


app = FastAPI()


@app.post("/get_weather")
async def get_weather(body: GetWeatherRequest) -> GetWeatherResponse:
    return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is cold.")


@app.get("/")
async def liveness() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
