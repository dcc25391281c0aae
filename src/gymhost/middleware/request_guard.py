"""Request bodies an app refuses before any handler reads them: too large, nested too deeply, or not text.

A Gym server parses every body with ``json.loads`` and echoes parts of it back in its answers (FastAPI's 422 repeats
the input); these kinds of input turn that into a 500 or worse, and each is cheaper to refuse at the door than to
survive inside:

- a huge body is read into memory whole (``max_body_bytes``; a ``Content-Length`` above it is refused before a byte
  is read, a streamed body as soon as it passes the limit): 413;
- deep nesting overflows the recursion of whatever walks the parsed value (FastAPI's encoder, pydantic, a grader):
  400 beyond ``max_json_depth``. Counting depth costs a scan only when the body holds more brackets than the limit;
- a lone surrogate escape (``"\\ud800"``) is valid JSON but no Unicode string: it parses, then fails to encode in
  the answer or on its way to an environment: 400;
- ``NaN`` and ``Infinity``, which Python's parser accepts and no JSON encoder writes back: 400;
- bytes that are not UTF-8, which FastAPI's error answer cannot repeat: 400.

The answer is JSON with a ``detail``, as FastAPI's own errors are. Bodies declared JSON or text, or not declared at
all, are checked (a Gym tool route parses whatever it gets as JSON); other types (a file upload) only for size.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate

from starlette.types import ASGIApp, Receive, Scope, Send

from .._asgi import answer_json, replay_first
from .._config import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH

__all__ = ["RequestGuardMiddleware", "json_problem"]

# A string, unrolled (no alternation per character). The end of the body also closes one: a string left open
# would otherwise make every later quote start a scan to the end, quadratic in the body's size.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)', re.DOTALL)
# A number that may parse as infinity: a three-digit exponent, or hundreds of digits.
_HUGE_NUMBER = re.compile(rb"[eE][+]?\d{3}|\d{300}")
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but brackets, to delete
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# Escaped backslashes and surrogate escapes, scanned left to right: a pair of backslashes is consumed as one token,
# so a literal "\\ud800" in the text is never taken for an escape.
_SURROGATE_ESCAPE = re.compile(rb"\\\\|\\u([dD][89a-fA-F][0-9a-fA-F]{2})")


def json_problem(body: bytes, max_depth: int) -> str | None:
    """Why ``body`` must be refused before it is parsed, or None. Not a JSON validator: malformed JSON is left to
    the parser, which answers it in the app's own way."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as error:
            return f"the body is not UTF-8 text (byte {error.start}: {error.reason})"
    if (b"\\ud" in body or b"\\uD" in body) and _has_lone_surrogate(body):
        return "the body holds a lone UTF-16 surrogate escape (such as \\ud800), which is not Unicode text"
    if len(body) > max_depth and body.count(b"[") + body.count(b"{") > max_depth and _deeper_than(body, max_depth):
        return f"the body's JSON is nested more than {max_depth} levels deep"
    if (b"NaN" in body or b"Infinity" in body or _HUGE_NUMBER.search(body)) and _has_non_finite(body):
        return "the body holds NaN or Infinity (or a number too large for a float), which JSON cannot carry"
    return None


class _Constant(Exception):
    pass


def _raise_constant(name: str) -> None:
    raise _Constant(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999 parses as inf, which no JSON encoder writes back
        raise _Constant(text)
    return value


def _has_non_finite(body: bytes) -> bool:
    """Whether the parser meets NaN, Infinity or a number that overflows to infinity, as a value (not inside a
    string). Only a body that may hold one is parsed here; one that does not parse is the app's parser's to
    answer."""
    try:
        json.loads(body, parse_constant=_raise_constant, parse_float=_finite_float)
    except _Constant:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def _has_lone_surrogate(body: bytes) -> bool:
    """A high surrogate escape not followed at once by a low one, or a low one without a high one before it."""
    high_ends_at = -1
    for match in _SURROGATE_ESCAPE.finditer(body):
        unit = match.group(1)
        if high_ends_at >= 0:
            if unit is None or unit[1:2] in b"89abAB" or match.start() != high_ends_at:
                return True
            high_ends_at = -1
        elif unit is not None:
            if unit[1:2] not in b"89abAB":
                return True
            high_ends_at = match.end()
    return high_ends_at >= 0


def _deeper_than(body: bytes, max_depth: int) -> bool:
    """Whether brackets outside strings nest deeper than ``max_depth``: strings removed and everything but brackets
    deleted at C speed, then the running depth, stopping at the first level past the limit."""
    brackets = _STRING.sub(b"", body).translate(None, _BRACKETS)
    return any(depth > max_depth for depth in accumulate(_STEP[byte] for byte in brackets))


class RequestGuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length, is_json = None, True
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
            elif name == b"content-type":
                kind = value.lower()
                is_json = b"json" in kind or kind.startswith(b"text/")
        if length is not None and length > self.max_body_bytes:
            await _refuse(scope, receive, send, 413, self._too_large())
            return
        if length == 0 or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        await self._guarded(scope, receive, send, is_json)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, is_json: bool) -> None:
        """Read the whole body (the app would anyway), check it, then hand it to the app as one message."""
        message = await receive()
        if message["type"] != "http.request":  # the client left: let the app see that
            await self.app(scope, replay_first(message, receive), send)
            return
        body = message.get("body", b"")
        if message.get("more_body", False):
            chunks, size = [body], len(body)
            while message.get("more_body", False):
                message = await receive()
                if message["type"] != "http.request":
                    await self.app(scope, replay_first(message, receive), send)
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    await _refuse(scope, receive, send, 413, self._too_large())
                    return
                chunks.append(chunk)
            body = b"".join(chunks)
            message = {"type": "http.request", "body": body, "more_body": False}
        elif len(body) > self.max_body_bytes:
            await _refuse(scope, receive, send, 413, self._too_large())
            return
        problem = json_problem(body, self.max_json_depth) if is_json and body else None
        if problem is not None:
            await _refuse(scope, receive, send, 400, problem)
            return
        await self.app(scope, replay_first(message, receive), send)

    def _too_large(self) -> str:
        return f"the request body is larger than this server's limit of {self.max_body_bytes} bytes"


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    await answer_json(scope, receive, send, status, {"detail": detail})
