"""The owner stamp: which process made a session, written into its cookie and its MCP tokens, and read back.

One codec, so that the stamp's format changes in one place:

- ``stamp`` writes this process's ``Owner`` into a session's or a token's payload, and ``owner_of`` reads it from a
  payload whose signature was checked (the session cookie's middleware, the MCP token's serializer);
- ``head_owner`` reads it from a raw request head, unchecked, before anything parses the request (a worker handing a
  connection to the worker that owns it, ``_serving._handoff``); ``unchecked_cookie_owner`` and
  ``unchecked_token_owner`` read it from a cookie or a token whose signature did not check (one signed with another
  secret: its episode is lost, ``_ownership``). It knows the cookie's layout (``_cookie``:
  ``base64(json).timestamp.signature``) and the token's (itsdangerous's ``payload.signature``). Unchecked is enough
  there: the owner checks the signature as for any request, so a forged stamp costs at most a forward.
"""

from __future__ import annotations

import contextlib
import json
from base64 import b64decode
from collections.abc import Mapping, MutableMapping
from typing import Any

from itsdangerous import URLSafeSerializer

__all__ = [
    "OWNER_KEY",
    "TOKEN_HEADER",
    "Owner",
    "head_owner",
    "is_stamp_only",
    "owner_of",
    "stamp",
    "unchecked_cookie_owner",
    "unchecked_token_owner",
]

# {"replica": id, "worker": index, "start": this start's nonce, "url": where the replica listens, if it said}
Owner = dict[str, Any]
OWNER_KEY = "gymhost_owner"  # where a session's and a token's payload carry their owner
TOKEN_HEADER = "x-nemo-gym-session-token"  # nemo_gym.base_resources_server.NEMO_GYM_MCP_SESSION_TOKEN_HEADER

_TOKEN = TOKEN_HEADER.encode()
_payloads = URLSafeSerializer("")  # only its payload decoding: the owner checks the signature


def stamp(payload: MutableMapping[str, Any], owner: Owner) -> None:
    payload[OWNER_KEY] = owner


def owner_of(payload: Any) -> Any:
    """The owner a checked payload names, or None (a payload of before stamps, or not gymhost's)."""
    return payload.get(OWNER_KEY) if isinstance(payload, Mapping) else None


def is_stamp_only(payload: Mapping[str, Any]) -> bool:
    """A session holding its owner and nothing else: the handler cleared it."""
    return not payload.keys() - {OWNER_KEY}


def head_owner(head: bytes) -> Any:
    """The owner a POST request's head names (its MCP token first, as the ownership middleware reads it, then any
    session cookie), or None: not a POST, not a whole head, or no owner in it."""
    if not head.startswith(b"POST "):
        return None
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    cookies: list[bytes] = []
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == _TOKEN:
            owner = unchecked_token_owner(value.strip())
            if owner is not None:
                return owner
        elif name == b"cookie":
            cookies.append(value)
    for header in cookies:
        for part in header.split(b";"):
            owner = unchecked_cookie_owner(part.partition(b"=")[2].strip().strip(b'"'))
            if owner is not None:
                return owner
    return None


def unchecked_token_owner(token: bytes) -> Any:
    """The owner an MCP token's payload names, its signature unchecked (None: not one of gymhost's tokens)."""
    with contextlib.suppress(Exception):  # not one of gymhost's tokens: the owner-less request is served here
        return owner_of(_payloads.load_payload(token.rpartition(b".")[0]))
    return None


def unchecked_cookie_owner(value: bytes) -> Any:
    """The owner a session cookie's payload names, its signature unchecked (None: not one of gymhost's cookies)."""
    if value.count(b".") < 2:
        return None
    with contextlib.suppress(ValueError):
        return owner_of(json.loads(b64decode(value.rsplit(b".", 2)[0])))
    return None
