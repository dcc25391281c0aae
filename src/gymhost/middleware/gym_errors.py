"""Gym's exception middleware, as pure ASGI.

NeMo Gym wraps every request in an ``@app.middleware("http")`` function that turns an uncaught exception into a
500 whose JSON body is ``repr(e)`` (what a model sees when its tool call broke the server). Registered that way it
runs through Starlette's ``BaseHTTPMiddleware``, which costs a task group and a pair of memory streams per request.
This class gives the same answers without them:

- an ``aiohttp.ClientResponseError`` from a call to another Gym server: ``"Hit an exception in <server> calling an
  inner server: <its response>"``;
- a cancelled request: ``"Request was cancelled"`` (nemo-gym 0.5+);
- any other exception: ``repr(e)``, and the traceback in the log;
- anything else: ``"An unknown error occurred"``.

As with Gym's, an error after the response has started cannot become a 500; it propagates to the server.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["GymErrorsMiddleware"]

logger = logging.getLogger("gymhost")


class GymErrorsMiddleware:
    def __init__(self, app: ASGIApp, *, server_key: str) -> None:
        self.app = app
        self.server_key = server_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            if started:
                raise
            await JSONResponse(self._describe(error, scope), status_code=500)(scope, receive, send)

    def _describe(self, error: BaseException, scope: Scope) -> str:
        content = getattr(error, "response_content", None)
        if content is not None and type(error).__name__ == "ClientResponseError":
            text = content.decode(errors="replace") if isinstance(content, bytes) else str(content)
            logger.error("%s: a call to another Gym server failed: %s", self.server_key, text[:1000])
            # Gym formats the bytes with an f-string (b'...'); the answer is kept identical.
            return f"Hit an exception in {self.server_key} calling an inner server: {content!s}"
        if isinstance(error, asyncio.CancelledError):
            return "Request was cancelled"
        if isinstance(error, Exception):
            logger.error("%s %s raised %r", scope.get("method"), scope.get("path"), error, exc_info=error)
            return repr(error)
        logger.error("%s %s: unknown error %r", scope.get("method"), scope.get("path"), error, exc_info=error)
        return "An unknown error occurred"
