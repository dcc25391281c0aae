"""OpenEnv environments (PyPI ``openenv``), as gymhost plays episodes on them: over ``/ws``.

With ``_wire`` (one session's frames, errors and rewards) and ``_task_api`` (the HTTP side), this is the only code
that speaks OpenEnv, checked against ``openenv`` 0.10.0. A written server's pool holds OpenEnv *sessions*: an
instance is the right to keep one session open on the server (whose ``max_concurrent_envs`` bounds them), and each
Gym episode is one session, a WebSocket of its own: ``begin`` opens it and sends OpenEnv's ``reset`` with the task's
``seed.reset`` (its split and index), each tool call is a ``call_tool`` step, grading reads the rewards the steps
carried, and the pool's ``clear`` on release sends ``close``. A session per episode, as OpenEnv means it, gives every
episode a fresh environment object on the server. gymhost talks with ``websockets`` and httpx; the ``openenv``
package itself (hundreds of MB with gradio) is never imported.

The reward is the one Gym's own OpenEnv adapter gives: the sum of the rewards of the reset and of every step (a
null reward counts nothing). Once a step says ``done``, further tool calls are refused as the model's error, as that
adapter does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from agentenv_protocol import ToolResult
from websockets.asyncio.client import connect, unix_connect
from websockets.exceptions import InvalidHandshake

from .._backend import ELSEWHERE, Catalog, Instance, ToolSession, forever
from .._errors import (
    DataPlaneError,
    EnvAtCapacityError,
    EnvDroppedError,
    EnvFailedError,
    EnvTimeoutError,
    EnvUnavailableError,
    MalformedReplyError,
)
from .._grading import Asked, Observation
from .._outcomes import NO_REWARD, UNREACHABLE
from .._settings import PoolSettings
from .._tasks import Seed, TaskTool
from ._wire import (
    CLOSE_TIMEOUT_S,
    MAX_FRAME_BYTES,
    Session,
    Tally,
    environment_error,
    listed_tools,
    openenv_catalog,
)

__all__ = ["OpenEnvClient", "OpenEnvLauncher"]

# Progress of long work (reading a source's tasks), which `gymhost write` shows as it goes: a logger of its own, so
# that showing it shows nothing else.
progress = logging.getLogger("gymhost.progress")

_CAPACITY_RETRY_S = (0.02, 0.05, 0.1, 0.2, 0.5)  # then every 0.5 s, until the load's limit
# A verify ends the open turn with the final text, then every turn the environment opens after it with no reply; an
# environment still opening turns after this many is not ending the episode.
_MAX_TURNS_AT_VERIFY = 64
_TRANSPORT_ERROR = "transport_error"  # openenv's ToolErrorType for a tool call that could not reach its server


# -- an instance: the right to one session at a time ----------------------------------------------------------------


class OpenEnvClient:
    """What the pool and the episodes ask of an instance (``_backend.InstanceClient``), for an OpenEnv server.

    The catalog is read once per launcher (a session, ``list_tools``, ``close``) and shared: an instance costs nothing
    until an episode begins on it."""

    def __init__(self, launcher: OpenEnvLauncher, settings: PoolSettings) -> None:
        self._launcher = launcher
        self._settings = settings
        self.base_url = launcher.url
        self._session: Session | None = None
        self._tally = Tally()
        self._tool_timeout = settings.data_timeout_s

    async def describe(self) -> Catalog:
        return await self._launcher.catalog(self._settings)

    async def hidden_tools(self, catalog: Catalog) -> set[str]:
        return set()  # OpenEnv has no hidden tools

    async def clear(self) -> None:
        """End the episode's session, if it has one: between episodes, an instance holds no session."""
        session, self._session = self._session, None
        self._tally = Tally()
        if session is not None:
            await session.close()

    async def begin(self, seed: Seed) -> None:
        """Open the episode's session and reset it to the task (its ``seed.reset``: split and index)."""
        await self.clear()
        self._session = await self._launcher.open_session(seed.reset or {}, self._settings, self._tally)

    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> ToolSession:
        self._tool_timeout = timeout
        return _Tools(self, timeout)

    async def observe(self, catalog: Catalog, asked: Asked, final_text: str) -> Observation:
        """The environment's reward. A turn still open is ended first with the final assistant text, as the reply
        tool (agent-env's ``end_turn``) would have been called with it; turns the environment opens after it, which
        the model never reached, are ended with no reply, the model's loss. An episode that ended with no reward at
        all, or with an error, is not graded: it raises, and the episode is masked."""
        tally = self._tally
        reply_tool = self._launcher.reply_tool
        if not tally.done and reply_tool is not None and reply_tool in _tool_names(asked.tools, catalog):
            await self._end_turns(reply_tool, final_text)
        if tally.done and not tally.rewards:
            raise EnvFailedError(
                f"{self.base_url}: the environment ended the episode without a reward (every step's was null)",
                kind=NO_REWARD,
            )
        total = sum(tally.rewards)
        detail = (
            f"the environment's reward: {total:g}, the sum of {len(tally.rewards)} reward(s) over "
            f"{tally.steps} step(s){'; it said done' if tally.done else '; it had not said done'}"
        )
        return Observation(environment=(total, detail))

    async def state(self) -> dict[str, Any]:
        """The episode so far (the pool view's ``data``)."""
        tally = self._tally
        session = self._session is not None and not self._session.closed
        return {"session_open": session, "steps": tally.steps, "rewards": tally.rewards, "done": tally.done}

    async def aclose(self) -> None:
        await self.clear()

    async def step(self, name: str, arguments: dict[str, Any], timeout: float) -> ToolResult:
        session, tally = self._session, self._tally
        if session is None:
            raise EnvDroppedError(f"{self.base_url}: no session open for this episode")
        if tally.done:
            return _text_result("the episode has ended: the environment said done; no more tool calls", error=True)
        message = {"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}}
        reply = await session.request(message, timeout, f"call_tool {name}")
        data = reply["data"]
        if reply.get("type") == "error":
            code, text = data.get("code"), str(data.get("message") or "the environment reported an error")
            if code in ("EXECUTION_ERROR", "VALIDATION_ERROR"):  # the tool or its arguments: the model's to see
                return _text_result(text, error=True)
            raise DataPlaneError(f"{self.base_url}: call_tool {name} failed: {text} ({code})")
        if reply.get("type") != "observation":
            raise MalformedReplyError(f"{self.base_url}: call_tool {name}: a reply of type {reply.get('type')!r}")
        tally.steps += 1
        tally.add(data)
        if (error := environment_error(data)) is not None:
            raise EnvFailedError(f"{self.base_url}: call_tool {name}: the environment ended the episode: {error}")
        observation = data.get("observation")
        failed = observation.get("error") if isinstance(observation, dict) else None
        if isinstance(failed, dict) and failed.get("error_type") == _TRANSPORT_ERROR:
            # The environment could not reach the server behind the tool: not the model's to answer for.
            raise EnvFailedError(
                f"{self.base_url}: call_tool {name}: the environment could not reach the tool: {failed.get('message')}",
                kind=UNREACHABLE,
            )
        return _observation_result(observation, tally)

    async def _end_turns(self, reply_tool: str, final_text: str) -> None:
        reply = final_text
        for _ in range(_MAX_TURNS_AT_VERIFY):
            result = await self.step(reply_tool, {"response": reply}, self._tool_timeout)
            if result.isError:
                raise EnvFailedError(f"{self.base_url}: ending the turn with {reply_tool} failed: {result.text}")
            if self._tally.done:
                return
            reply = ""  # a turn the model never reached: it answered nothing
        raise EnvFailedError(
            f"{self.base_url}: the environment opened {_MAX_TURNS_AT_VERIFY} more turns after the episode's verify"
        )


def _tool_names(tools: tuple[TaskTool, ...] | None, catalog: Catalog) -> set[str]:
    if tools is not None:
        return {tool.name for tool in tools}
    return {str(tool.get("name")) for tool in catalog.tools}


class _Tools:
    """An episode's tool calls: steps of its session (``environments._backend.ToolSession``)."""

    def __init__(self, client: OpenEnvClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    async def open(self) -> _Tools:
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return await self._client.step(name, arguments, self._timeout)

    async def list_tools(self) -> list[dict[str, Any]]:
        return list((await self._client.describe()).tools)

    async def close(self) -> None:
        pass  # the session is the episode's: the pool's clear closes it


def _observation_result(observation: Any, tally: Tally) -> ToolResult:
    """A ``call_tool`` observation as the text the model sees: the tool's text content (its structured content as
    JSON when it has no text), or the environment's error message, as an error. A result that opens the next turn
    (agent-env's ``end_turn`` answers ``{"prompt", "system_prompt"}``) is that turn's prompt, with its system prompt
    first when the turn changes it."""
    if not isinstance(observation, dict):
        return _text_result(json.dumps(observation))
    error = observation.get("error")
    if isinstance(error, dict) and error:
        return _text_result(str(error.get("message") or json.dumps(error)), error=True)
    result = observation.get("result")
    if not isinstance(result, dict):
        return _text_result("" if result is None else json.dumps(result))
    if "content" not in result and isinstance(result.get("prompt"), str):
        system = result.get("system_prompt")
        changed = isinstance(system, str) and system and system != tally.system_prompt
        tally.system_prompt = system if isinstance(system, str) else tally.system_prompt
        return _text_result(f"System: {system}\n\n{result['prompt']}" if changed else result["prompt"])
    texts = [
        block["text"]
        for block in result.get("content") or []
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    text = "\n".join(str(t) for t in texts)
    if not texts and result.get("structured_content") is not None:
        text = json.dumps(result["structured_content"])
    elif not texts and "content" not in result:
        text = json.dumps(result)
    return _text_result(text, error=bool(result.get("is_error")))


def _text_result(text: str, *, error: bool = False) -> ToolResult:
    return ToolResult(content=[{"type": "text", "text": text}], isError=error)


# -- the launcher ---------------------------------------------------------------------------------------------------


class OpenEnvLauncher:
    """Sessions on one OpenEnv server (``environments._backend.Launcher``). Its instances are gymhost's own
    bookkeeping, so the pool makes and replaces them freely; the server's ``max_concurrent_envs`` is what bounds
    them, and a written config's ``max_instances`` should not exceed it (a session over it is refused for capacity,
    retried for up to ``lease_timeout_s``, then masked ``provider_unavailable``).

    ``reply_tool`` is the tool that ends the model's turn with its reply (agent-env's ``end_turn``), which a verify
    calls with the final assistant text when the turn is still open; ``uds`` the Unix socket the server listens on,
    when it is not reached over TCP."""

    owns_instances = True
    confinement_level = ELSEWHERE  # the OpenEnv server runs the environment's code, as its operator confined it

    def __init__(self, url: str, environment: str, *, reply_tool: str | None = None, uds: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.environment = environment
        self.reply_tool = reply_tool
        self.uds = uds
        self.description = f"OpenEnv environment {environment!r} at {self.url}"
        self._ws_url = "ws" + self.url.removeprefix("http") + "/ws"
        self._catalog: Catalog | None = None
        self._catalog_lock = asyncio.Lock()

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        return Instance(index, OpenEnvClient(self, settings))

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()

    async def exited(self, instance: Instance) -> None:
        await forever()  # nothing to watch between episodes; a dropped session fails its episode

    async def close(self) -> None:
        pass

    async def catalog(self, settings: PoolSettings) -> Catalog:
        """The environment's tools, read once over a session of its own. An environment whose tools exist only
        inside an episode (agent-env's) answers none, or an error, before a reset: its catalog has no tools, and its
        tasks carry theirs (``read_resets``)."""
        async with self._catalog_lock:
            if self._catalog is None:
                session, reply = await self._open(
                    {"type": "step", "data": {"type": "list_tools"}}, "list_tools", settings
                )
                await session.close()
                self._catalog = openenv_catalog(self.environment, listed_tools(reply, self.url) or [])
            return self._catalog

    async def open_session(self, reset: dict[str, Any], settings: PoolSettings, tally: Tally) -> Session:
        """A new session, reset with ``reset`` (the data of the reset message), whose rewards ``tally`` counts. A
        reset the environment answers with an error of its own (agent-env's deploy failed, say) raises
        ``EnvFailedError``."""
        session, reply = await self._open({"type": "reset", "data": reset}, f"reset {json.dumps(reset)}", settings)
        data = reply["data"]
        if (error := environment_error(data)) is not None:
            await session.close()
            raise EnvFailedError(f"{self.url}: reset {json.dumps(reset)}: the environment could not start it: {error}")
        tally.add(data)
        metadata = data.get("observation", {}).get("metadata") if isinstance(data.get("observation"), dict) else None
        if isinstance(metadata, dict) and isinstance(metadata.get("system_prompt"), str):
            tally.system_prompt = metadata["system_prompt"]
        return session

    async def read_resets(
        self, resets: list[dict[str, Any]], settings: PoolSettings, *, tools: bool
    ) -> list[tuple[dict[str, Any], list[dict[str, Any]] | None]]:
        """What each reset answers (its ``data``) and, with ``tools``, what ``list_tools`` answers right after it,
        over one session: where ``gymhost write`` finds the prompts of tasks that do not carry theirs, and the tools
        of an environment that has them only inside an episode."""
        if not resets:
            return []
        session, reply = await self._open(
            {"type": "reset", "data": resets[0]}, f"reset {json.dumps(resets[0])}", settings
        )
        answers = []
        try:
            for number, reset in enumerate(resets):
                what = f"reset {json.dumps(reset)}"
                if number:
                    reply = await session.request({"type": "reset", "data": reset}, settings.data_timeout_s, what)
                if reply.get("type") != "observation":
                    raise DataPlaneError(f"{self.url}: {what} failed: {json.dumps(reply)[:300]}")
                if (error := environment_error(reply["data"])) is not None:
                    raise EnvFailedError(f"{self.url}: {what}: the environment could not start it: {error}")
                listed = None
                if tools:
                    message = {"type": "step", "data": {"type": "list_tools"}}
                    answer = await session.request(message, settings.data_timeout_s, f"list_tools after {what}")
                    listed = listed_tools(answer, self.url)
                    if listed is None:
                        raise MalformedReplyError(f"{self.url}: list_tools after {what}: {json.dumps(answer)[:300]}")
                answers.append((reply["data"], listed))
                # Each read, for a progress bar (DEBUG); a tenth at a time, for a log (INFO).
                tenth = (10 * len(answers)) // len(resets) > (10 * (len(answers) - 1)) // len(resets)
                if len(resets) > 1:
                    counting = f"{self.environment}, split {reset.get('split')}"
                    progress.log(logging.INFO if tenth else logging.DEBUG, "%s: the resets of %d of %d tasks read",
                                 counting, len(answers), len(resets),
                                 extra={"counting": counting, "done": len(answers), "total": len(resets)})  # fmt: skip
        finally:
            await session.close()
        return answers

    async def _open(self, message: dict[str, Any], what: str, settings: PoolSettings) -> tuple[Session, dict[str, Any]]:
        """A new session and the observation its first message answered, each exchange within ``data_timeout_s``.
        A session refused for capacity is a seed waiting for a free instance, the server's this time: it is tried
        again until ``lease_timeout_s`` (the slot of the session closed just before may not be free yet, or another
        client holds the server's sessions). Any other error is the environment's (``DataPlaneError``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.lease_timeout_s
        attempt = 0
        while True:
            session = await self._connect(settings.data_timeout_s)
            try:
                reply = await session.request(message, settings.data_timeout_s, what)
            except BaseException:
                await session.abort()
                raise
            if reply.get("type") == "observation":
                return session, reply
            await session.abort()
            data = reply["data"]
            if reply.get("type") != "error":
                raise MalformedReplyError(f"{self.url}: {what}: a reply of type {reply.get('type')!r}")
            if data.get("code") != "CAPACITY_REACHED":
                raise DataPlaneError(f"{self.url}: {what} failed: {data.get('message')} ({data.get('code')})")
            pause = _CAPACITY_RETRY_S[min(attempt, len(_CAPACITY_RETRY_S) - 1)]
            attempt += 1
            if loop.time() + pause > deadline:
                raise EnvAtCapacityError(
                    f"{self.url}: every session of the OpenEnv server is taken ({data.get('message')}) and none came "
                    f"free in {settings.lease_timeout_s:g}s (lease_timeout_s): raise its max_concurrent_envs, or "
                    "lower this server's max_instances"
                )
            await asyncio.sleep(pause)

    async def _connect(self, timeout: float) -> Session:
        options: dict[str, Any] = {
            "max_size": MAX_FRAME_BYTES,
            "open_timeout": timeout,
            "close_timeout": CLOSE_TIMEOUT_S,
        }
        try:
            if self.uds is not None:
                connection = await unix_connect(self.uds, self._ws_url, **options)
            else:
                connection = await connect(self._ws_url, proxy=None, **options)
        except TimeoutError:
            raise EnvTimeoutError(f"{self._ws_url}: no session opened in {timeout:g}s") from None
        except InvalidHandshake as error:
            raise EnvUnavailableError(f"{self._ws_url}: not an OpenEnv session endpoint: {error}") from None
        except OSError as error:
            raise EnvUnavailableError(f"{self._ws_url}: {error}") from None
        return Session(connection, self._ws_url)
