"""Tool calls on an in-process instance without HTTP: its FastMCP server object called directly.

An in-process instance lives in the server's own process, yet over MCP's streamable-HTTP transport each tool call was
an HTTP request through an in-memory ASGI transport, an SSE stream and JSON-RPC text both ways: most of the cost of a
call whose tool takes microseconds (measured in ``benchmarks/README.md``, "What made it fast"). ``DirectToolSession``
hands the request object to the handler mcp's low-level server registered for it, with the request context its
transport would have set, so everything from there on is the same code as over HTTP: agentenv's dispatch wrapper (the
``ToolContext``, ``on_tool_call``, an ``AgentEnvError`` as an error result, tool access), FastMCP's argument
validation and mcp's result handling. Against mcp's in-memory streams with ``ClientSession`` (slower, and a task group
per session that must be left in the task that entered it) this is the cheaper and simpler of the two;
``tests/test_direct_tools.py`` holds the two paths to the same answers.

The caller reaches the tool as a gateway-forwarded one: role and session in the request's ``_meta``
(``agentenv.io/role``, ``agentenv.io/session``), which agentenv's ``context_from_mcp`` reads ahead of headers. What
differs from HTTP, by design: no Starlette request behind ``ctx.request_context.request``; a call past its time
limit is cancelled rather than left running; a tool that asks the client something (sampling, elicitation, roots)
is refused at once instead of waiting for an answer gymhost never sends.

It relies on mcp's low-level server (``FastMCP._mcp_server``, ``Server.request_handlers`` keyed by request type,
``request_ctx``, ``RequestContext``), stable across mcp 1.x and reorganised in mcp 2, hence ``mcp<2``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from typing import Any

from agentenv_protocol import ROLE_META_KEY, SESSION_META_KEY, ToolResult
from mcp import types
from mcp.server.experimental.request_context import Experimental
from mcp.server.lowlevel import server as lowlevel
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError

from ..._version import __version__
from .._errors import EnvTimeoutError, McpMalformedReplyError, McpSessionError
from ._client import MCP_PROTOCOL_VERSION
from ._eager import start_eagerly

__all__ = ["DirectToolSession"]

_CLOSE_TIMEOUT_S = 5.0
_NOT_SUPPORTED = types.ErrorData(
    code=types.METHOD_NOT_FOUND, message="this client answers no server requests (sampling, elicitation, roots)"
)


class _NullServerSession:
    """Stands in for mcp's ``ServerSession``: notifications (logs, progress) are dropped, as gymhost's HTTP client
    drops them; a request to the client fails at once with an ``McpError``."""

    def __init__(self, client_params: types.InitializeRequestParams) -> None:
        self.client_params = client_params

    def check_client_capability(self, capability: types.ClientCapabilities) -> bool:
        return False

    async def _dropped(self, *args: Any, **kwargs: Any) -> None:
        return None

    send_log_message = send_progress_notification = send_resource_updated = _dropped
    send_resource_list_changed = send_tool_list_changed = send_prompt_list_changed = _dropped
    send_notification = send_elicit_complete = send_message = _dropped

    async def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise McpError(_NOT_SUPPORTED)

    create_message = list_roots = elicit = elicit_form = elicit_url = send_ping = send_request = _refused


class DirectToolSession:
    """One tool session on an in-process FastMCP app: the surface of ``_agentenv._client.McpSession``, without its
    transport. Use it on the event loop that opened it."""

    def __init__(self, app: Any, *, role: str | None, timeout: float) -> None:
        self.timeout = timeout
        self.session_id: str | None = None
        self._server: Any = app._mcp_server
        self._role = role
        self._ids = itertools.count(1)
        self._session = _NullServerSession(
            types.InitializeRequestParams(
                protocolVersion=MCP_PROTOCOL_VERSION,
                capabilities=types.ClientCapabilities(),
                clientInfo=types.Implementation(name="gymhost", version=__version__),
            )
        )
        # What mcp's _handle_request builds for every request; nothing in it varies between a session's calls.
        self._experimental = Experimental(
            task_metadata=None,
            _client_capabilities=types.ClientCapabilities(),
            _session=self._session,  # type: ignore[arg-type]
        )
        self._meta: types.RequestParams.Meta | None = None
        self._lifespan_context: Any = None
        self._lifespan_task: asyncio.Task[None] | None = None
        self._lifespan_stop = asyncio.Event()

    async def open(self) -> DirectToolSession:
        """What ``initialize`` does over HTTP: a session id, and the server's per-session lifespan entered (the
        default one yields ``{}`` and needs no task)."""
        await self.close()
        if self._server.lifespan is lowlevel.lifespan:
            self._lifespan_context = {}
        else:
            self._lifespan_context = await self._enter_lifespan()
        self.session_id = uuid.uuid4().hex
        entries: dict[str, Any] = {SESSION_META_KEY: self.session_id}
        if self._role:  # as McpSession sends AgentEnv-Role only when there is a role
            entries[ROLE_META_KEY] = self._role
        self._meta = types.RequestParams.Meta.model_validate(entries)
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=name, arguments=arguments, _meta=self._meta)
        )
        result = await self._request("tools/call", request)
        if not isinstance(result, types.CallToolResult):
            raise McpMalformedReplyError(f"tools/call {name}: answered {type(result).__name__}, not a tool result")
        content = [block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in result.content]
        try:
            return ToolResult.model_validate({"content": content, "isError": result.isError})
        except ValueError as error:
            raise McpMalformedReplyError(f"tools/call {name}: unreadable result: {error}") from None

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool with its ``_meta``, as ``tools/list`` answers it in JSON, across pages."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor, _meta=self._meta))
            result = await self._request("tools/list", request)
            if not isinstance(result, types.ListToolsResult):
                raise McpMalformedReplyError(f"tools/list answered {type(result).__name__}")
            tools += [tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in result.tools]
            if not result.nextCursor:
                return tools
            cursor = result.nextCursor

    async def close(self) -> None:
        """End the session: later calls fail as calls on a deleted session do. Never raises."""
        self.session_id, self._meta = None, None
        task, self._lifespan_task = self._lifespan_task, None
        if task is not None:
            self._lifespan_stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), min(self.timeout, _CLOSE_TIMEOUT_S))
            if not task.done():
                task.cancel()

    async def _request(self, method: str, request: Any) -> Any:
        if self.session_id is None:
            raise McpSessionError(f"{method}: the MCP session is not open (or was closed)")
        handler = self._server.request_handlers.get(type(request))
        if handler is None:
            raise McpSessionError(f"{method} failed: Method not found (code {types.METHOD_NOT_FOUND})")
        context: RequestContext[Any, Any, Any] = RequestContext(  # type: ignore[type-var]
            request_id=next(self._ids),
            meta=self._meta,
            session=self._session,
            lifespan_context=self._lifespan_context,
            experimental=self._experimental,
            request=None,  # no HTTP request: a tool reading request headers itself finds none
        )
        # A task of its own: the request context, the ToolContext and whatever the tool sets stay in there.
        deadline = asyncio.get_running_loop().time() + self.timeout  # counting what runs before the tool's first wait
        task = start_eagerly(_handle(handler, request, context))
        if task is None:
            raise McpSessionError(f"{method}: the tool stopped its process")
        if task.done():  # a tool that never waited could not be interrupted, past its limit or not
            response = task.result()
        else:
            try:
                async with asyncio.timeout_at(deadline):  # cancels the task, as wait_for did
                    response = await task
            except TimeoutError:
                raise EnvTimeoutError(f"MCP {method} did not answer within {self.timeout:g}s") from None
        if isinstance(response, types.ErrorData):
            raise McpSessionError(f"{method} failed: {response.message} (code {response.code})")
        return response.root

    async def _enter_lifespan(self) -> Any:
        """A custom per-session lifespan runs in a task of its own, entered and left there (anyio requires it);
        gymhost opens and closes tool sessions from different tasks."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[Any] = loop.create_future()
        stop = self._lifespan_stop = asyncio.Event()
        server = self._server

        async def run() -> None:
            try:
                async with server.lifespan(server) as context:
                    started.set_result(context)
                    await stop.wait()
            except BaseException as error:
                if started.done():
                    raise
                started.set_exception(error)

        self._lifespan_task = loop.create_task(run())
        return await started


async def _handle(handler: Any, request: Any, context: RequestContext[Any, Any, Any]) -> Any:
    """mcp's ``Server._handle_request`` without the transport (and with its ``raise_exceptions=False``)."""
    lowlevel.request_ctx.set(context)
    try:
        return await handler(request)
    except McpError as error:
        return error.error
    except Exception as error:  # the server answers any other failure as an error with code 0
        return types.ErrorData(code=0, message=str(error))
