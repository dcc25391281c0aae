"""What test_fuzz needs: an app driven in-process from sync code, hostile inputs, and the oracle of a clear error.

Hypothesis calls a test function once per example, synchronously; an app's lifespan (a written server's environment
instances) must run once for all of them. ``live`` runs the lifespan on an event loop in a thread of its own (an
anyio blocking portal) and ``LiveApp.post`` sends one request to it through ``httpx.ASGITransport`` on that loop.
"""

from __future__ import annotations

import asyncio
import json
import math
from base64 import b64decode, b64encode
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st

from gymhost import ToolOutput, Transcript

BASE = "http://gymhost.test"
REQUEST_TIMEOUT_S = 30.0  # an answer that takes longer is a hang, not an answer
# An MCP tool whose arguments fail the environment's own validation answers this, as the model's tool output.
TOOL_ERROR_PREFIX = "Error executing tool "


@dataclass(frozen=True)
class Answer:
    """One response, read whole, with the request it answers (for assertion messages)."""

    request: str
    status: int
    content_type: str
    body: bytes
    cookie: str  # the Cookie header the client sends next: the session's cookies

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.request} -> {self.status} {self.content_type}: {self.text[:600]}"


class LiveApp:
    """An ASGI app whose lifespan runs on the portal's event loop; every request is sent on that loop."""

    def __init__(self, app: Any, portal: BlockingPortal) -> None:
        self.app = app
        self.portal = portal
        self.transport = httpx.ASGITransport(app=app)

    def post(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        *,
        content_type: str | None = "application/json",
        cookie: str = "",
    ) -> Answer:
        return self.portal.call(self._post, path, body, content_type, cookie)

    def post_json(self, path: str, value: Any, *, cookie: str = "") -> Answer:
        return self.post(path, encode(value), cookie=cookie)

    def get_json(self, path: str) -> Any:
        return self.portal.call(self._get_json, path)

    def post_all(self, requests: list[tuple[str, bytes, str | None, str]]) -> list[Answer]:
        """``(path, body, content_type, cookie)`` requests sent at once, answered in order."""

        async def gather() -> list[Answer]:
            return list(await asyncio.gather(*(self._post(*request) for request in requests)))

        return self.portal.call(gather)

    async def _post(
        self, path: str, body: bytes | AsyncIterator[bytes], content_type: str | None, cookie: str
    ) -> Answer:
        headers = {}
        if content_type is not None:
            headers["content-type"] = content_type
        if cookie:
            headers["cookie"] = cookie
        shown = body[:120] if isinstance(body, bytes) else b"<streamed>"
        request = (
            f"POST {path} ({content_type}) {shown!r}{'...' if isinstance(body, bytes) and len(body) > 120 else ''}"
        )
        with anyio.fail_after(REQUEST_TIMEOUT_S):
            async with httpx.AsyncClient(base_url=BASE, transport=self.transport) as client:
                response = await client.post(path, content=body, headers=headers)
        sent = "; ".join(f"{name}={value}" for name, value in response.cookies.items()) or cookie
        return Answer(request, response.status_code, response.headers.get("content-type", ""), response.content, sent)

    async def _get_json(self, path: str) -> Any:
        with anyio.fail_after(REQUEST_TIMEOUT_S):
            async with httpx.AsyncClient(base_url=BASE, transport=self.transport) as client:
                response = await client.get(path)
        assert response.status_code == 200, f"GET {path} -> {response.status_code}: {response.text[:300]}"
        return response.json()


@contextmanager
def live(app: Any) -> Iterator[LiveApp]:
    """``app`` with its lifespan started once, for every request sent through the yielded ``LiveApp``."""
    with (
        start_blocking_portal(backend="asyncio") as portal,
        portal.wrap_async_context_manager(app.router.lifespan_context(app)),
    ):
        yield LiveApp(app, portal)


# -- bodies and what the guard must do with them -------------------------------------------------------------------


def encode(value: Any) -> bytes:
    """JSON as a hostile client writes it: NaN and Infinity literals allowed, every character outside ASCII (lone
    surrogates included) written as a ``\\u`` escape, so the bytes are ASCII whatever the value holds."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode("ascii")


def decode(body: bytes) -> tuple[bool, Any]:
    """(True, value) when Python's json module parses ``body``, else (False, None)."""
    try:
        return True, json.loads(body)
    except (ValueError, RecursionError):
        return False, None


def json_depth(value: Any) -> int:
    """Containers nested in ``value``: a scalar is 0, ``[1]`` is 1, ``{"a": [1]}`` is 2."""
    if isinstance(value, list):
        return 1 + max((json_depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((json_depth(item) for item in value.values()), default=0)
    return 0


def has_lone_surrogate(value: Any) -> bool:
    """A string (key or value) of the parsed body holds a UTF-16 surrogate code point: an escape not paired with
    its other half (json joins a proper pair into one character)."""
    if isinstance(value, str):
        return any(0xD800 <= ord(char) <= 0xDFFF for char in value)
    if isinstance(value, list):
        return any(has_lone_surrogate(item) for item in value)
    if isinstance(value, dict):
        return any(has_lone_surrogate(key) or has_lone_surrogate(item) for key, item in value.items())
    return False


def refusal(body: bytes, *, max_body_bytes: int, max_json_depth: int) -> int | None:
    """The status the request guard of every create_app app must answer for this JSON body, before any route sees
    it: 413 above the size limit, 400 for bytes that are not UTF-8, a lone surrogate, NaN or Infinity, or nesting
    beyond the depth limit; None when it must pass the body on."""
    if len(body) > max_body_bytes:
        return 413
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return 400
    parsed, value = decode(body)
    if parsed and (has_lone_surrogate(value) or json_depth(value) > max_json_depth or has_non_finite(value)):
        return 400
    return None


def has_non_finite(value: Any) -> bool:
    """NaN or an infinity among the parsed values (NaN, Infinity, or a number like 1e999 that overflows): Python's
    parser reads them, no JSON encoder writes them back."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(has_non_finite(item) for item in value)
    if isinstance(value, dict):
        return any(has_non_finite(item) for item in value.values())
    return False


def assert_clear(answer: Answer, *, tool_output: bool = False) -> None:
    """Never a 5xx; a 4xx is JSON with a ``detail``. With ``tool_output``, a 400 may instead be the environment's own
    answer to a tool call it refused (plain text the model reads, as Gym's tool errors are)."""
    assert answer.status < 500, f"server error for bad input: {answer}"
    if 400 <= answer.status < 500:
        if tool_output and answer.status == 400 and answer.text.startswith(TOOL_ERROR_PREFIX):
            return
        assert answer.content_type.startswith("application/json"), f"a 4xx that is not JSON: {answer}"
        payload = answer.json()
        assert isinstance(payload, dict), f"a 4xx that is not a JSON object: {answer}"
        assert "detail" in payload, f"a 4xx without a detail: {answer}"


# -- strategies ----------------------------------------------------------------------------------------------------

# Characters that break naive handling: NUL, BOM, bidi override, a noncharacter, an astral character, the
# characters JSON and a depth scan care about, and text that only looks like an escape.
_ODD = ["\x00", "\ufeff", "\u202e", "\uffff", "\U0001f600", "\\", '"', "[", "]", "{", "}", "\n", "\x7f"]
_ODD += ["\\ud800", "\\u0000", "NaN"]
# UTF-16 surrogate halves: alone they are no Unicode text; a high one right before a low one is a pair.
_SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00"]


def _texts(pieces: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(pieces, max_size=12).map("".join)


clean_text = st.text(max_size=16) | _texts(st.characters() | st.sampled_from(_ODD))
surrogate_text = _texts(
    st.characters()
    | st.sampled_from(_ODD)
    | st.sampled_from(_SURROGATES)
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
)
odd_text = clean_text | surrogate_text  # one string: surrogate halves in about half of them

big_numbers = st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1, 2**64, 1e308, -1e308, 5e-324, -0.0])


def _scalars(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(), big_numbers, st.floats(allow_nan=True, allow_infinity=True), text
    )


def _values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        _scalars(text),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=16,
    )


scalars = _scalars(odd_text)
clean_values = _values(clean_text)
# A value holds many strings; were each one free to hold surrogate halves, nearly every value would, and the guard
# would answer them all before a route saw anything. So half the values have none at all.
json_values = clean_values | _values(surrogate_text)


def nest(value: Any, depth: int, kind: str) -> Any:
    """``value`` inside ``depth`` arrays (or single-key objects)."""
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def deep_values(limit: int) -> st.SearchStrategy[Any]:
    """Values nested just under, at and just over ``limit`` levels: where an off-by-one would show."""
    return st.builds(
        nest,
        st.one_of(_scalars(clean_text), st.just([]), st.just({})),
        st.integers(limit - 3, limit + 3),
        st.sampled_from(["list", "dict"]),
    )


def _splice(body: bytes, at: int, splice: bytes, cut: bool) -> bytes:
    spliced = body[:at] + splice + body[at:]
    return spliced[: at + len(splice)] if cut else spliced


def mangled(encoded: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Valid JSON with a few bytes spliced in, and maybe the rest cut off: almost-JSON, the likeliest garbage."""
    splices = st.binary(max_size=4) | st.sampled_from([b"\x00", b"\xff", b"\xed\xa0\x80", b"\\", b'"', b"NaN", b"["])
    return st.builds(_splice, encoded, st.integers(0, 64), splices, st.booleans())


raw_bodies = st.one_of(
    st.binary(max_size=96),
    mangled(json_values.map(encode)),
    st.sampled_from(
        [b"", b"{", b"}", b"NaN", b"-Infinity", b"\x00", b"\xff\xfe", b"\xef\xbb\xbf{}", b'{"a":1,}', b"[" * 400]
    ),
)

content_types = st.sampled_from(
    [
        "application/json",
        None,
        "text/plain",
        "application/json; charset=latin-1",
        "application/vnd.api+json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/octet-stream",
        "",
    ]
)


# -- episodes ------------------------------------------------------------------------------------------------------


def verify_body(row: dict[str, Any], transcript: Transcript | None = None) -> dict[str, Any]:
    return {**row, "response": (transcript or Transcript()).response("")}


class Witness:
    """An episode of the counter task seeded before the garbage and finished after it: it must score 1.0, as if
    nothing had happened in between."""

    def __init__(self, app: LiveApp, row: dict[str, Any]) -> None:
        self.app, self.row = app, row
        seeded = app.post_json("/seed_session", row)
        assert seeded.status == 200, f"the witness could not seed: {seeded}"
        self.cookie = seeded.cookie

    def finish(self) -> None:
        pool = self.app.get_json("/agentenv/pool")
        assert pool["open_episodes"] == 1, f"episodes left open by the garbage (the witness is the only one): {pool}"
        moved = self.app.post_json("/increment", {"by": 2}, cookie=self.cookie)
        assert moved.status == 200, f"the witness's tool call: {moved}"
        assert json.loads(moved.text) == {"count": 3}, f"the witness's counter was touched: {moved}"
        transcript = Transcript()
        transcript.add_tool_call("increment", {"by": 2}, ToolOutput(moved.text, True, 200))
        verdict = self.app.post_json("/verify", verify_body(self.row, transcript), cookie=self.cookie)
        assert verdict.status == 200, f"the witness's verify: {verdict}"
        answer = verdict.json()
        assert (answer["reward"], answer["mask_sample"], answer["failure_kind"]) == (1.0, False, None), answer

    def abandon(self) -> None:
        self.app.post_json("/close_session", {}, cookie=self.cookie)


@contextmanager
def witnessed(app: LiveApp, row: dict[str, Any]) -> Iterator[Witness]:
    """Seed the witness, run the block, then finish the witness (or, when the block failed, close it so the next
    test starts from a pool with no open episode)."""
    witness = Witness(app, row)
    try:
        yield witness
    except BaseException:
        witness.abandon()
        raise
    witness.finish()


def forged_with_gyms_key(cookie: str) -> str:
    """The same session cookie re-signed the way nemo-gym signs its own (Starlette's signer, the cookie's name as the
    secret, which anyone can read off the code): a forgery gymhost's sessions must not honour."""
    name, value = cookie.split("=", 1)
    payload = json.loads(b64decode(value.split(".")[0]))
    import itsdangerous  # nemo-gym's dependency: this module is also collected where nemo-gym is absent

    forged = itsdangerous.TimestampSigner(name).sign(b64encode(json.dumps(payload).encode())).decode()
    return f"{name}={forged}"
