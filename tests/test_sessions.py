"""gymhost's session middleware keeps Gym's cookie contract: what a client sees when a session is cleared, changed
in place, or kept alive past half its age."""

from __future__ import annotations

import asyncio
import json
from base64 import b64decode
from pathlib import Path

import httpx
import pytest

from gymhost import create_app

from .test_folder_errors import CONFIG, make_folder

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

NOTES_SERVER = """\
from fastapi import FastAPI, Request

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY


class NotesServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/start")(self.start)
        app.post("/bump")(self.bump)
        app.post("/forget")(self.forget)
        app.post("/look")(self.look)
        app.post("/mark")(self.mark)
        app.post("/restamp")(self.restamp)
        return app

    async def start(self, request: Request) -> dict:
        request.session["notes"] = {"n": 0}
        return {"session_id": request.session[SESSION_ID_KEY]}

    async def bump(self, request: Request) -> dict:
        request.session["notes"]["n"] += 1  # changed in place: Starlette's session only notices top-level writes
        return {"n": request.session["notes"]["n"]}

    async def forget(self, request: Request) -> dict:
        request.session.pop(SESSION_ID_KEY)
        request.session.pop("notes", None)
        return {}

    async def look(self, request: Request) -> dict:
        return dict(request.session)

    async def mark(self, request: Request) -> dict:  # 1, then True: equal in Python, not in JSON
        request.session["mark"] = True if "mark" in request.session else 1
        return dict(request.session)

    async def restamp(self, request: Request) -> dict:  # the one nested value of a plain session, changed in place
        owner = request.session["gymhost_owner"]
        owner["worker"] = bool(owner["worker"]) if type(owner["worker"]) is int else int(owner["worker"])
        return dict(request.session)

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)
"""

COOKIE = "NotesServer___notes"


@pytest.fixture
def client_for(tmp_path: Path):  # type: ignore[no-untyped-def]
    folder = make_folder(tmp_path, name="notes", config=CONFIG.format(key="notes", name="notes"), app=NOTES_SERVER)
    app = create_app(folder)

    def client() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://notes.test")

    return client


async def test_every_answer_varies_on_the_cookie_and_carries_it(client_for) -> None:  # type: ignore[no-untyped-def]
    async with client_for() as client:
        answer = await client.post("/start")
        assert answer.headers["vary"] == "Cookie"
        assert answer.headers["set-cookie"].startswith(f"{COOKIE}=")
        assert "; path=/; Max-Age=1209600; httponly; samesite=lax" in answer.headers["set-cookie"]


async def test_a_cleared_session_deletes_the_cookie(client_for) -> None:  # type: ignore[no-untyped-def]
    async with client_for() as client:
        first = (await client.post("/start")).json()["session_id"]
        forgot = await client.post("/forget")
        assert forgot.headers["set-cookie"].startswith(f"{COOKIE}=null; path=/; expires=Thu, 01 Jan 1970 00:00:00 GMT")
        assert COOKIE not in client.cookies
        assert (await client.post("/start")).json()["session_id"] != first


async def test_a_session_changed_in_place_is_not_confused_with_its_old_cookie(client_for) -> None:  # type: ignore[no-untyped-def]
    async with client_for() as client:
        await client.post("/start")
        old = client.cookies[COOKIE]
    for _ in range(2):  # replaying the same cookie starts from the state it carries, every time
        async with client_for() as client:
            answer = await client.post("/bump", headers={"cookie": f"{COOKIE}={old}"})
            assert answer.json() == {"n": 1}
            new = answer.cookies[COOKIE]
            assert new != old
            assert json.loads(b64decode(new.split(".")[0] + "=="))["notes"] == {"n": 1}


async def test_a_plain_session_keeps_its_cookie_until_it_changes(client_for) -> None:  # type: ignore[no-untyped-def]
    """A session of plain values (Gym's: its id and the owner stamp) goes back as the cookie that came in while it
    is unchanged, and any change, even one Python holds equal (1 to True), is signed into a new cookie."""

    def carried(cookie: str) -> dict:  # type: ignore[type-arg]
        return json.loads(b64decode(cookie.split(".")[0] + "=="))  # type: ignore[no-any-return]

    async with client_for() as client:
        seeded = await client.post("/look")
        first = client.cookies[COOKIE]
        assert seeded.headers["set-cookie"].startswith(f"{COOKIE}={first};")
        for _ in range(2):
            assert (await client.post("/look")).headers["set-cookie"].startswith(f"{COOKIE}={first};")
        await client.post("/mark")
        marked = client.cookies[COOKIE]
        assert marked != first
        assert carried(marked)["mark"] == 1
        await client.post("/mark")
        assert carried(client.cookies[COOKIE])["mark"] is True
        before = client.cookies[COOKIE]
        owner = carried(before)["gymhost_owner"]["worker"]
        await client.post("/restamp")
        assert client.cookies[COOKIE] != before
        assert carried(client.cookies[COOKIE])["gymhost_owner"]["worker"] == owner
        assert type(carried(client.cookies[COOKIE])["gymhost_owner"]["worker"]) is not type(owner)
        assert (await client.post("/look")).json()["session_id"] == seeded.json()["session_id"]


async def test_the_session_is_found_among_other_cookies(client_for) -> None:  # type: ignore[no-untyped-def]
    async with client_for() as client:
        session_id = (await client.post("/start")).json()["session_id"]
        value = client.cookies[COOKIE]
    headers = [
        f"{COOKIE}={value}",
        f'theme=dark;{COOKIE}="{value}"',
        f"X{COOKIE}=forged; a={COOKIE}=forged ;  {COOKIE}={value} ; b=2",
    ]
    for header in headers:
        async with client_for() as client:
            assert (await client.post("/start", headers={"cookie": header})).json()["session_id"] == session_id, header
    async with client_for() as client:  # only look-alikes: a new session
        answer = await client.post("/start", headers={"cookie": f"X{COOKIE}={value}; a={COOKIE}={value}"})
        assert answer.json()["session_id"] != session_id


async def test_a_session_in_use_slides_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unchanged session's cookie is sent back as it came, until half its age: then signed again."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from gymhost.middleware import GymSessionMiddleware

    async def who(request: Request) -> JSONResponse:
        return JSONResponse(request.session["session_id"])

    # Signing times are whole seconds; a 3 s session called every second for 5 s must outlive its first cookie.
    app = GymSessionMiddleware(Starlette(routes=[Route("/", who)]), cookie_name="s", secret="k", max_age=3)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s.test") as client:
        ids, cookies = [], set()
        for _ in range(6):
            answer = await client.get("/")
            ids.append(answer.json())
            cookies.add(answer.cookies["s"])
            await asyncio.sleep(1.0)
    assert len(set(ids)) == 1
    assert len(cookies) > 1  # re-signed on the way, not re-sent forever


async def test_the_cookies_of_finished_episodes_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache of verified cookies holds the episodes in play: a cookie unseen for two generations is dropped
    (and verified again if it ever returns), so a server that has played 10,000 episodes keeps only the last few
    seconds' worth, whatever its rate."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from gymhost._sessions import _cookie
    from gymhost.middleware import GymSessionMiddleware

    async def who(request: Request) -> JSONResponse:
        return JSONResponse(request.session["session_id"])

    now = [0.0]
    monkeypatch.setattr(_cookie, "time", SimpleNamespace(monotonic=lambda: now[0], time=_cookie.time.time))
    app = GymSessionMiddleware(Starlette(routes=[Route("/", who)]), cookie_name="s", secret="k")
    verified = 0
    unsign = _cookie.itsdangerous.TimestampSigner.unsign

    def counted(self: _cookie.itsdangerous.TimestampSigner, *args: object, **kwargs: object) -> object:
        nonlocal verified
        verified += 1
        return unsign(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_cookie.itsdangerous.TimestampSigner, "unsign", counted)

    async def again(client: httpx.AsyncClient, cookie: str) -> str:
        answer = await client.get("/", headers={"cookie": f"s={cookie}"})
        return str(answer.json())

    async def episode(client: httpx.AsyncClient, calls: int) -> str:
        first = await client.get("/", headers={"cookie": ""})
        cookie = first.cookies["s"]
        for _ in range(calls):
            assert await again(client, cookie) == first.json()
        return cookie

    def kept() -> int:
        return len(app._verified) + len(app._verified_before)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s.test") as client:
        old = [await episode(client, 3) for _ in range(50)]
        assert (verified, kept()) == (50, 50)  # each cookie verified once, on its episode's first call
        first_session = await again(client, old[0])
        playing = old[1]
        for _ in range(3):  # three generations later, 50 new episodes in each, and one still playing throughout
            now[0] += _cookie._VERIFIED_GENERATION_S
            for _ in range(50):
                await episode(client, 3)
            before = verified
            await again(client, playing)
            assert verified == before  # a cookie in use is kept from one generation to the next
        assert kept() <= 101  # the last two generations' episodes and the one still playing, not all 201
        verified = 0
        assert await again(client, old[0]) == first_session  # unseen for three generations: still its session
        assert verified == 1  # verified again
        assert await again(client, old[0]) == first_session
        assert verified == 1  # and kept from then on
