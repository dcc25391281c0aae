"""Gym's session cookie, kept apart per mount and signed with a secret nobody can read off the code.

NeMo Gym sessions are a Starlette ``SessionMiddleware`` cookie named ``<Class>___<config name>``, signed with that
same string as the secret, at ``path=/``, plus a function middleware that puts a ``session_id`` in every session.
Three things follow: anyone can forge a session (the secret is public), a cookie jar sends every mounted server's
cookie to every other mount, and the same server mounted twice shares one session.

``GymSessionMiddleware`` here replaces both of Gym's middlewares with one pure-ASGI class:

- the cookie keeps Gym's name, so clients that keep the cookies of ``/seed_session`` work unchanged;
- its path is the mount prefix (``scope["root_path"]``), so a cookie goes back only to the server that set it;
- it is signed with ``GYMHOST_SECRET`` (or a random secret made once per process) and salted with the mount
  prefix, so a cookie from one mount, or one signed with Gym's public key, starts a new session instead;
- every session gets a ``session_id``, and the cookie is sent on every response, as Gym's middleware does;
- a new session is stamped with the process that made it (``gymhost_owner``: its replica id and this start of it),
  so another process can tell the session is not its own (``ownership``).

Several workers or replicas behind one load balancer must share ``GYMHOST_SECRET``, or each refuses the others'
cookies.
"""

from __future__ import annotations

import json
import time
from base64 import b64decode, b64encode
from typing import Any, Literal
from uuid import uuid4

import itsdangerous
from itsdangerous.exc import BadSignature
from starlette.middleware.sessions import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._keys import FORWARDED
from ._identity import process_state
from ._owner import is_stamp_only, stamp
from ._signing import process_secret

__all__ = ["SESSION_ID_KEY", "GymSessionMiddleware"]

SESSION_ID_KEY = "session_id"  # nemo_gym.server_utils.SESSION_ID_KEY
_SALT = "gymhost.session"
_VERIFIED_KEPT = 100_000  # cookies kept verified at most; beyond that the cache starts again
_VERIFIED_GENERATION_S = 60.0  # a cookie unseen for between one and two of these is verified again when it returns


class GymSessionMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        cookie_name: str,
        secret: str | None = None,
        max_age: int | None = 14 * 24 * 60 * 60,
        same_site: Literal["lax", "strict", "none"] = "lax",
        https_only: bool = False,
    ) -> None:
        self.app = app
        self.cookie_name = cookie_name
        self.secret = secret or process_secret()
        self.max_age = max_age
        self.flags = f"httponly; samesite={same_site}" + ("; secure" if https_only else "")
        self._signers: dict[str, itsdangerous.TimestampSigner] = {}
        # Cookies already verified, by (mount, value), with when they were signed and their JSON: an episode sends
        # the same cookie on every call, and checking its signature each time was most of this middleware's cost.
        # Two generations, swapped every _VERIFIED_GENERATION_S: the cookies of finished episodes are forgotten,
        # so the cache holds the episodes in play, not every episode the server ever saw.
        self._verified: dict[tuple[str, str], tuple[float, str]] = {}
        self._verified_before: dict[tuple[str, str], tuple[float, str]] = {}
        self._generation_ends = time.monotonic() + _VERIFIED_GENERATION_S

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        mount = scope.get("root_path") or ""
        signer = self._signer(mount)
        raw, signed_at, payload = self._load(scope, mount, signer)
        session = Session(self._decode(payload))
        if SESSION_ID_KEY not in session:
            session[SESSION_ID_KEY] = str(uuid4())
            stamp(session, process_state.owner())
        scope["session"] = session
        cookie_path = mount or "/"

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start" and not FORWARDED.get(scope):
                # (a forwarded request's answer carries its owner's cookie, not this process's)
                current: dict[str, Any] = scope["session"]
                cookie = None
                if not is_stamp_only(current):  # the owner alone is no session: the handler cleared it
                    encoded = json.dumps(current)
                    if raw is not None and encoded == payload and self._fresh(signed_at):
                        value = raw  # unchanged (compared as JSON, so changes inside nested values count)
                    else:
                        value = signer.sign(b64encode(encoded.encode())).decode()
                    max_age = f"Max-Age={self.max_age}; " if self.max_age is not None else ""
                    cookie = f"{self.cookie_name}={value}; path={cookie_path}; {max_age}{self.flags}"
                elif raw is not None:  # the handler cleared the session: the client drops the cookie
                    expired = "expires=Thu, 01 Jan 1970 00:00:00 GMT; "
                    cookie = f"{self.cookie_name}=null; path={cookie_path}; {expired}{self.flags}"
                # Appended as raw header pairs: building a MutableHeaders per response cost more than the rest.
                headers = list(message.get("headers", ()))
                headers.append((b"vary", b"Cookie"))
                if cookie is not None:
                    headers.append((b"set-cookie", cookie.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _fresh(self, signed_at: float) -> bool:
        """An unchanged session goes back as the cookie that came in, until half its life is used: then it is
        signed again, so a session in use keeps sliding forward as Starlette's does."""
        return self.max_age is None or time.time() - signed_at < self.max_age / 2

    def _signer(self, mount: str) -> itsdangerous.TimestampSigner:
        signer = self._signers.get(mount)
        if signer is None:
            signer = self._signers[mount] = itsdangerous.TimestampSigner(self.secret, salt=f"{_SALT}:{mount}")
        return signer

    def _load(self, scope: Scope, mount: str, signer: itsdangerous.TimestampSigner) -> tuple[str | None, float, str]:
        """The cookie's value, when it was signed, and its JSON payload, if validly signed for this mount."""
        raw = self._cookie(scope)
        if not raw:
            return None, 0.0, ""
        key = (mount, raw)
        known = self._verified.get(key)
        if known is None:
            if time.monotonic() >= self._generation_ends or len(self._verified) >= _VERIFIED_KEPT:
                self._verified_before, self._verified = self._verified, {}
                self._generation_ends = time.monotonic() + _VERIFIED_GENERATION_S
            known = self._verified_before.pop(key, None)
            if known is not None:
                self._verified[key] = known
        if known is None or (self.max_age is not None and time.time() >= known[0] + self.max_age):
            try:
                payload, stamp = signer.unsign(raw.encode(), max_age=self.max_age, return_timestamp=True)
                known = (stamp.timestamp(), b64decode(payload).decode())
            except (BadSignature, ValueError):
                return None, 0.0, ""
            self._verified[key] = known
        return raw, known[0], known[1]

    @staticmethod
    def _decode(payload: str) -> dict[str, Any]:
        """A fresh session dict per request: nothing a handler changes reaches the cache of verified cookies."""
        if not payload:
            return {}
        try:
            data = json.loads(payload)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _cookie(self, scope: Scope) -> str | None:
        """This middleware's cookie from the Cookie header(s), without parsing every other cookie."""
        prefix = self.cookie_name + "="
        for name, value in scope["headers"]:
            if name == b"cookie":
                for part in bytes(value).decode("latin-1").split(";"):
                    part = part.strip()
                    if part.startswith(prefix):
                        return part[len(prefix) :].strip('"')
        return None
