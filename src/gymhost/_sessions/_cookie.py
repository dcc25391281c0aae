"""Gym's session cookie, kept apart per mount and signed with a secret nobody can read off the code.

NeMo Gym sessions are a Starlette ``SessionMiddleware`` cookie named ``<Class>___<config name>``, signed with that
same string as the secret, at ``path=/``, plus a function middleware that puts a ``session_id`` in every session.
Three things follow: anyone can forge a session (the secret is public), a cookie jar sends every mounted server's
cookie to every other mount, and the same server mounted twice shares one session.

``GymSessionMiddleware`` here replaces both of Gym's middlewares with one pure-ASGI class:

- the cookie keeps Gym's name, so clients that keep the cookies of ``/seed_session`` work unchanged;
- its path is the mount prefix (``scope["root_path"]``), so a cookie goes back only to the server that set it;
- it is signed with the process secret (``_signing``: ``GYMHOST_SECRET``, or the one gymhost keeps) and salted with
  the mount prefix, so a cookie from one mount, or one signed with Gym's public key, starts a new session instead;
  but a cookie gymhost stamped that does not verify here (signed with another secret: this server before a restart
  with a secret of that start alone, or a replica with another) names an episode that is lost, not a new one: its
  unchecked owner goes on the scope (``UNVERIFIED_OWNER``) for ``_ownership`` to answer;
- every session gets a ``session_id``, and the cookie is sent on every response, as Gym's middleware does;
- a new session is stamped with the process that made it (``gymhost_owner``: its replica id and this start of it),
  so another process can tell the session is not its own (``ownership``).

Several replicas behind one load balancer must share ``GYMHOST_SECRET``, or each answers the others' episodes as
lost.
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

from .._keys import FORWARDED, UNVERIFIED_OWNER
from ._identity import process_state
from ._owner import OWNER_KEY, is_stamp_only, stamp, unchecked_cookie_owner
from ._signing import process_secret

__all__ = ["SEEDED_KEY", "SESSION_ID_KEY", "GymSessionMiddleware"]

SESSION_ID_KEY = "session_id"  # nemo_gym.server_utils.SESSION_ID_KEY
SEEDED_KEY = "gymhost_seeded"  # a written server's seed sets it: the session has played an episode (``_ownership``)
_SALT = "gymhost.session"
_VERIFIED_KEPT = 100_000  # cookies kept verified at most; beyond that the cache starts again
# A cookie unseen for between one and two of these is verified again when it returns: about 15 us, against the
# seconds a model takes between two calls of an episode. The cache holds every episode that started within the last
# two generations, about 2 KB each (at 125 new episodes a second, 10 s generations hold 1,250 to 2,500 of them,
# 2.5 to 5 MB; 60 s generations held up to 30 MB).
_VERIFIED_GENERATION_S = 10.0


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
        self._prefix = f"{cookie_name}="
        self.secret = secret or process_secret()
        self.max_age = max_age
        self.flags = f"httponly; samesite={same_site}" + ("; secure" if https_only else "")
        self._signers: dict[str, itsdangerous.TimestampSigner] = {}
        # Cookies already verified, by (mount, value): an episode sends the same cookie on every call, and checking
        # its signature each time was most of this middleware's cost. Two generations, swapped every
        # _VERIFIED_GENERATION_S: the cookies of finished episodes are forgotten, so the cache holds the episodes in
        # play, not every episode the server ever saw.
        self._verified: dict[tuple[str, str], _Verified] = {}
        self._verified_before: dict[tuple[str, str], _Verified] = {}
        self._generation_ends = time.monotonic() + _VERIFIED_GENERATION_S

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        mount = scope.get("root_path") or ""
        signer = self._signer(mount)
        known = self._load(scope, mount, signer)
        session = known.session() if known is not None else Session()
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
                if known is not None and known.kept(current, session) and self._fresh(known.signed_at):
                    cookie = known.header  # a plain session, unchanged: the cookie that came in goes back
                elif not is_stamp_only(current):  # the owner alone is no session: the handler cleared it
                    encoded = json.dumps(current)
                    if known is not None and encoded == known.payload and self._fresh(known.signed_at):
                        cookie = known.header  # unchanged (compared as JSON, so changes inside nested values count)
                    else:
                        cookie = self._header(signer.sign(b64encode(encoded.encode())).decode(), cookie_path)
                elif known is not None:  # the handler cleared the session: the client drops the cookie
                    expired = "expires=Thu, 01 Jan 1970 00:00:00 GMT; "
                    cookie = f"{self.cookie_name}=null; path={cookie_path}; {expired}{self.flags}".encode("latin-1")
                # Appended as raw header pairs: building a MutableHeaders per response cost more than the rest.
                headers = list(message.get("headers", ()))
                headers.append((b"vary", b"Cookie"))
                if cookie is not None:
                    headers.append((b"set-cookie", cookie))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _header(self, value: str, cookie_path: str) -> bytes:
        max_age = f"Max-Age={self.max_age}; " if self.max_age is not None else ""
        return f"{self.cookie_name}={value}; path={cookie_path}; {max_age}{self.flags}".encode("latin-1")

    def _fresh(self, signed_at: float) -> bool:
        """An unchanged session goes back as the cookie that came in, until half its life is used: then it is
        signed again, so a session in use keeps sliding forward as Starlette's does."""
        return self.max_age is None or time.time() - signed_at < self.max_age / 2

    def _signer(self, mount: str) -> itsdangerous.TimestampSigner:
        signer = self._signers.get(mount)
        if signer is None:
            signer = self._signers[mount] = itsdangerous.TimestampSigner(self.secret, salt=f"{_SALT}:{mount}")
        return signer

    def _load(self, scope: Scope, mount: str, signer: itsdangerous.TimestampSigner) -> _Verified | None:
        """What the request's cookie carries, if it is validly signed for this mount; if it is gymhost's but not
        (another secret's), the owner it names goes on the scope."""
        raw = self._cookie(scope)
        if not raw:
            return None
        key = (mount, raw)
        known = self._verified.get(key)
        if known is None:
            if time.monotonic() >= self._generation_ends or len(self._verified) >= _VERIFIED_KEPT:
                self._verified_before, self._verified = self._verified, {}
                self._generation_ends = time.monotonic() + _VERIFIED_GENERATION_S
            known = self._verified_before.pop(key, None)
            if known is not None:
                self._verified[key] = known
        if known is None or (self.max_age is not None and time.time() >= known.signed_at + self.max_age):
            try:
                payload, signed = signer.unsign(raw.encode(), max_age=self.max_age, return_timestamp=True)
                known = _Verified(signed.timestamp(), b64decode(payload).decode(), self._header(raw, mount or "/"))
            except (BadSignature, ValueError):
                owner = unchecked_cookie_owner(raw.encode("latin-1"))
                if owner is not None and not process_state.is_mine(owner):  # (this one's: another mount's cookie)
                    UNVERIFIED_OWNER.set(scope, owner)
                return None
            self._verified[key] = known
        return known

    def _cookie(self, scope: Scope) -> str | None:
        """This middleware's cookie from the Cookie header(s), found in the bytes without splitting every other
        cookie out (an episode's client may send a cookie per mount)."""
        for name, value in scope["headers"]:
            if name == b"cookie":
                found = _cookie_value(bytes(value).decode("latin-1"), self._prefix)
                if found is not None:
                    return found
        return None


class _Verified:
    """A cookie whose signature was checked: when it was signed, its JSON, its ``Set-Cookie`` header as it came in,
    and, for a plain session (scalars and the owner stamp: Gym's, an id and the owner), that session decoded once.

    Each request gets a session of its own, so nothing a handler changes reaches this cache. A plain session is
    copied instead of decoded, and found unchanged without being encoded again: Starlette's ``Session`` notes every
    write of a key, and the owner stamp, the one value that could change in place, is compared by type and value."""

    __slots__ = ("header", "payload", "plain", "signed_at")

    def __init__(self, signed_at: float, payload: str, header: bytes) -> None:
        self.signed_at = signed_at
        self.payload = payload
        self.header = header
        data = _decoded(payload)
        self.plain: dict[str, Any] | None = data if _is_plain(data) else None

    def session(self) -> Session:
        if self.plain is None:
            return Session(_decoded(self.payload))
        session = Session(self.plain)
        owner = self.plain.get(OWNER_KEY)
        if owner is not None:
            dict.__setitem__(session, OWNER_KEY, dict(owner))  # a copy of its own; not a write the session notes
        return session

    def kept(self, current: dict[str, Any], given: Session) -> bool:
        """Whether the session a handler leaves is the plain one it was given, as it was given."""
        if self.plain is None or current is not given or given.modified:
            return False
        return _same_scalars(current.get(OWNER_KEY), self.plain.get(OWNER_KEY))


def _decoded(payload: str) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        data = json.loads(payload)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


_SCALARS = (str, int, float, bool, type(None))
# Whether this Starlette's Session notes every write of a key (1.7+; 1.0 to 1.6 miss ``popitem`` and ``|=``): only
# then can a plain session be found unchanged by its ``modified`` flag.
_WRITES_NOTED = all(
    name in vars(Session)
    for name in ("__setitem__", "__delitem__", "clear", "pop", "popitem", "setdefault", "update", "__ior__")
)


def _is_plain(data: dict[str, Any]) -> bool:
    """Scalars only, and an owner stamp of scalars (and a Session that notes every write)."""
    if not _WRITES_NOTED:
        return False
    owner = data.get(OWNER_KEY)
    if owner is not None and not (type(owner) is dict and all(type(value) in _SCALARS for value in owner.values())):
        return False
    return all(type(value) in _SCALARS for key, value in data.items() if key != OWNER_KEY)


def _same_scalars(current: Any, given: Any) -> bool:
    """Equal as JSON: the same keys, each value of the same type and equal (``==`` alone takes 1 for True)."""
    if current is None or given is None:
        return current is given
    if type(current) is not dict or current.keys() != given.keys():
        return False
    return all(type(current[key]) is type(value) and current[key] == value for key, value in given.items())


def _cookie_value(header: str, prefix: str) -> str | None:
    """The value of the first ``name=value`` pair of a Cookie header whose ``prefix`` is ``name=``, as splitting the
    header on ``;`` and stripping each pair finds it. When the first occurrence of ``prefix`` starts a pair (the
    usual case: ``a=1; name=...``), it is that pair, read without splitting the others out."""
    at = header.find(prefix)
    if at < 0:
        return None
    if at == 0 or header[at - 1] == ";" or header[at - 2 : at] == "; ":
        end = header.find(";", at)
        return header[at + len(prefix) : end if end >= 0 else len(header)].rstrip().strip('"')
    for part in header.split(";"):
        part = part.strip()
        if part.startswith(prefix):
            return part[len(prefix) :].strip('"')
    return None
