"""A client that plays one episode against a resources server the way verifiers' NeMo Gym taskset does.

What verifiers 0.4.0 does, and so what this does by default: ``POST /seed_session`` with the whole row, keep the
cookies of that one response and send them with every later call (ignoring later ``Set-Cookie``), open a new
connection for every call, call each tool as ``POST /<name>`` with the arguments as the body (a non-2xx answer is
an error output for the model), and ``POST /verify`` with ``row | {"response": <Responses object>}``.

Tests, ``gymhost check``, the demo and the benchmarks all play episodes through this one class, so they all
exercise the contract real trainers rely on. ``transport`` lets it talk to an app in-process
(``httpx.ASGITransport``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

__all__ = ["EpisodeClient", "ToolOutput", "Transcript"]


@dataclass(frozen=True)
class ToolOutput:
    """A tool's answer as the model would see it: the response text, and whether the call succeeded."""

    text: str
    ok: bool
    status_code: int


@dataclass
class Transcript:
    """The model's side of an episode, turned into the Responses object ``/verify`` expects."""

    items: list[dict[str, Any]] = field(default_factory=list)

    def add_tool_call(self, name: str, arguments: dict[str, Any], output: ToolOutput) -> None:
        call_id = f"call_{len(self.items) // 2 + 1}"
        self.items.append(
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}
        )
        self.items.append({"type": "function_call_output", "call_id": call_id, "output": output.text})

    def response(self, final_text: str = "") -> dict[str, Any]:
        """The Responses object verifiers builds: tool calls and outputs, then the final assistant message."""
        output = list(self.items)
        if final_text:
            output.append(
                {
                    "id": f"msg_{len(output) + 1}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": final_text, "annotations": []}],
                }
            )
        return {
            "id": "resp_gymhost",
            "object": "response",
            "created_at": 0,
            "model": "gymhost-scripted",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }


class EpisodeClient:
    """One episode: seed, tool calls, verify. Use as an async context manager, or call ``aclose()``. ``token``:
    the bearer token of a server that requires one."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 60.0,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self.cookies = httpx.Cookies()
        self.transcript = Transcript()
        self._transport = transport
        self._timeout = timeout

    async def seed(self, row: dict[str, Any]) -> dict[str, Any]:
        response = await self._post("/seed_session", row)
        response.raise_for_status()
        self.cookies.update(response.cookies)
        answer: dict[str, Any] = response.json()
        return answer

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolOutput:
        arguments = arguments or {}
        response = await self._post(f"/{name}", arguments)
        output = ToolOutput(text=response.text, ok=response.is_success, status_code=response.status_code)
        self.transcript.add_tool_call(name, arguments, output)
        return output

    async def verify(self, row: dict[str, Any], final_text: str = "") -> dict[str, Any]:
        response = await self._post("/verify", {**row, "response": self.transcript.response(final_text)})
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """Any other call of the episode (``/close_session``, a raw tool call), with the seed's cookies."""
        return await self._post(path, body)

    async def aclose(self) -> None:
        """Nothing to release: every call opens a connection of its own, as verifiers does."""

    async def __aenter__(self) -> EpisodeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, transport=self._transport, timeout=self._timeout)

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        # Cookies go in a header, as verifiers sends them, so no client-side jar picks up later Set-Cookie.
        headers = {"cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        headers.update(self._auth)
        async with self._client() as client:
            return await client.post(path, json=body, headers=headers)
