"""docs/reference/http.md held as a test: every route, status and header its tables promise, against real servers.

Each row of the reference's tables, with each status it names (a route's own answer is a 200), is a promise. Every
promise is either checked here (``CHECKS``), against every server it concerns, or names the tests elsewhere that
hold it (``ELSEWHERE``); ``test_every_documented_promise_is_held`` fails on a promise the reference makes that
neither covers, and on one they cover that the reference no longer makes. Where a row lists several paths (the
liveness routes), a check runs once for each path the reference lists.

The servers are started once for the module: nemo-gym's ``example_single_tool_call`` (a Gym server) and gridsim
written by ``gymhost write`` (a written server), each served by ``gymhost serve``, by uvicorn's own command line
(``asgi:app`` with ``GYMHOST_FOLDER``), and mounted in a gateway (a Gym root of both) served both ways. Every process
runs with one token and one signing secret: a session seeded at one process and sent to the other process serving
the same server at the same path is a session whose owner is gone.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gymhost.environments import awrite_folder, write_folder

from .agentenv_helpers import GRIDSIM
from .conftest import REPO
from .processes import STATE_TIMEOUT_S, ServerProcess, free_port, gymhost_command, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes]

REFERENCE = REPO / "docs" / "reference" / "http.md"
TOKEN = "reference-token"
SECRET = "reference-secret-shared-by-every-process"
GYM_EXAMPLE = "example_single_tool_call"
WRITTEN = "gridsim"
MAX_BODY_BYTES = 32 * 1024 * 1024  # the reference's 32 MiB
# A Responses API answer with no output: all a verify needs besides the row.
RESPONSE = {"id": "r", "object": "response", "created_at": 0, "model": "m", "output": [], "tools": [],
            "parallel_tool_calls": True, "tool_choice": "auto"}  # fmt: skip

# The reference's sections, as its headings name them.
ANY = "Answers every route may give"
GYM = "Gym's routes"
MASKED = "A masked verdict"
OWN = "gymhost's routes"
WRITTEN_ROUTES = "A written server's routes"
GATEWAY = "A gateway's routes"

Promise = tuple[str, str, int]  # (section, the row's first cell without backticks, a status it promises)


def _gym_version() -> tuple[int, ...]:
    """Which of the promises that depend on nemo-gym's version apply, read when the cases are made."""
    try:
        return tuple(int(part) for part in version("nemo-gym").split(".")[:2])
    except PackageNotFoundError:  # the unit tier's venv collects this module too, and deselects it
        return ()


GYM_VERSION = _gym_version()

# -- the reference, read ---------------------------------------------------------------------------------------------

_HEADING = re.compile(r"^#{2,3} (.+)$")
_STATUS = re.compile(r"\b(200|[45]\d\d)\b")
_PATH = re.compile(r"`(?:[A-Z]+ )?(/[^`]*)`")


def documented() -> dict[Promise, tuple[str, ...]]:
    """Every promise of the reference's tables, with the paths its row's first cell lists."""
    promises: dict[Promise, tuple[str, ...]] = {}
    section = ""
    for line in REFERENCE.read_text().splitlines():
        if heading := _HEADING.match(line):
            section = heading.group(1)
            continue
        if not line.startswith("| ") or line.startswith(("| status |", "| route |")):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        paths = tuple(_PATH.findall(cells[0]))
        statuses = {int(status) for status in _STATUS.findall(" ".join(cells))} | ({200} if paths else set())
        for status in statuses:
            promises[(section, cells[0].replace("`", ""), status)] = paths
    return promises


# -- the servers ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One server as a client reaches it: a Gym server or a written one (or a gateway itself), in one process."""

    name: str
    kind: str  # "gym", "written" or "gateway"
    process: str
    prefix: str = ""  # where its routes are in that process
    peer: str = ""  # the target serving the same server at the same path in the other process


def _targets() -> dict[str, Target]:
    targets = [
        Target("gateway-serve", "gateway", "gateway-serve"),
        Target("gateway-uvicorn", "gateway", "gateway-uvicorn"),
    ]
    for kind, mounted in (("gym", f"/{GYM_EXAMPLE}"), ("written", f"/{WRITTEN}")):
        targets += [
            Target(f"{kind}-serve", kind, f"{kind}-serve", "", f"{kind}-uvicorn"),
            Target(f"{kind}-uvicorn", kind, f"{kind}-uvicorn", "", f"{kind}-serve"),
            Target(f"{kind}-mounted-serve", kind, "gateway-serve", mounted, f"{kind}-mounted-uvicorn"),
            Target(f"{kind}-mounted-uvicorn", kind, "gateway-uvicorn", mounted, f"{kind}-mounted-serve"),
        ]
    return {target.name: target for target in targets}


TARGETS = _targets()


@dataclass(frozen=True)
class Servers:
    urls: dict[str, str]  # process name: its URL
    rows: dict[str, list[dict[str, Any]]]  # kind: the rows of its folder


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, gym_root: Path) -> Iterator[Servers]:
    """The six processes, started together: each server by ``gymhost serve`` and by uvicorn, and a gateway of both,
    served both ways."""
    root = tmp_path_factory.mktemp("reference")
    written = write_folder(str(GRIDSIM), root, name=WRITTEN, instances=1).path
    shutil.copytree(gym_root / GYM_EXAMPLE, root / "resources_servers" / GYM_EXAMPLE)
    folders = {"gym": gym_root / GYM_EXAMPLE, "written": written, "gateway": root}
    serve_targets = {"gym": GYM_EXAMPLE, "written": str(written), "gateway": str(root)}  # Gym's example by its name
    env = {"GYMHOST_TOKEN": TOKEN, "GYMHOST_SECRET": SECRET}
    starts: dict[str, AbstractContextManager[ServerProcess]] = {}
    for kind, folder in folders.items():
        starts[f"{kind}-serve"] = serving(
            gymhost_command("serve", serve_targets[kind], "--port", "0"), env=env, ready_path="/readyz"
        )
        port = free_port()
        uvicorn = [sys.executable, "-m", "uvicorn", "asgi:app", "--host", "127.0.0.1", "--port", str(port)]
        starts[f"{kind}-uvicorn"] = serving(
            uvicorn,
            cwd=REPO,
            env={**env, "GYMHOST_FOLDER": str(folder)},
            url=f"http://127.0.0.1:{port}",
            ready_path="/readyz",
        )
    with ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        for name in ("NEMO_GYM_CONFIG_DICT", "NEMO_GYM_CONFIG_PATH", "GYMHOST_FOLDER"):
            patch.delenv(name, raising=False)  # an inherited Gym launcher variable would change what is served
        with ThreadPoolExecutor(len(starts)) as pool:  # each waits until it is ready; every one started is stopped
            started = {name: pool.submit(stack.enter_context, start) for name, start in starts.items()}
        urls = {name: future.result().url for name, future in started.items()}
        rows = {kind: _rows(folders[kind], kind) for kind in ("gym", "written")}
        yield Servers(urls, rows)


def _rows(folder: Path, kind: str) -> list[dict[str, Any]]:
    data = folder / "data" / ("example.jsonl" if kind == "gym" else "eval.jsonl")
    return [json.loads(line) for line in data.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class At:
    """A target as a check sees it: its URL, the other process's for the same server, and its rows."""

    target: Target
    url: str
    peer_url: str
    rows: list[dict[str, Any]]

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def mount(self) -> str:
        return self.target.prefix or "/"

    @property
    def row(self) -> dict[str, Any]:
        return self.rows[0]

    @property
    def tool(self) -> tuple[str, dict[str, Any]]:
        """A tool call that answers 200 within an episode."""
        return ("/get_weather", {"city": "Paris"}) if self.kind == "gym" else (f"/{WRITTEN}_look", {})

    def client(self, *, token: str | None = TOKEN, url: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=url or self.url, headers=headers, timeout=60)

    def peer(self, cookies: httpx.Cookies) -> httpx.Client:
        """A client of the other process serving this server at this path, with this process's session."""
        client = self.client(url=self.peer_url)
        client.cookies = cookies
        return client


def reach(servers: Servers, name: str) -> At:
    target = TARGETS[name]
    peer = TARGETS.get(target.peer)
    url = servers.urls[target.process] + target.prefix
    peer_url = servers.urls[peer.process] + peer.prefix if peer is not None else ""
    return At(target, url, peer_url, servers.rows.get(target.kind, []))


# -- what the checks share ------------------------------------------------------------------------------------------


def close(at: At, http: httpx.Client) -> httpx.Response | None:
    """Ends the episode of ``http``'s session: a written server's on every nemo-gym version, Gym's from 0.5 on (it
    takes the resources flow's body); nemo-gym 0.4.0's Gym servers have no close."""
    if at.kind == "written":
        return http.post("/close_session", json={})
    if GYM_VERSION >= (0, 5):
        return http.post("/close_session", json={"resources_session_id": "rs", "episode_id": {"rollout_id": "r"}})
    return None


@contextmanager
def episode(at: At, row: dict[str, Any] | None = None) -> Iterator[httpx.Client]:
    """A client whose session is seeded, closed at the end: a written server has one instance to lend."""
    with at.client() as http:
        seeded = http.post("/seed_session", json=row or at.row)
        assert seeded.status_code == 200, seeded.text
        try:
            yield http
        finally:
            close(at, http)


def verify_body(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "response": RESPONSE}


def refusal(answer: httpx.Response, status: int) -> dict[str, Any]:
    """gymhost's own refusals: JSON with a ``detail``."""
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert answer.headers["content-type"] == "application/json", answer.headers
    body: dict[str, Any] = answer.json()
    assert isinstance(body["detail"], str), body
    assert body["detail"], body
    return body


def raw_post(url: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """A POST whose head declares what its body will be, and no body: what a client about to send that body sends
    first. Answered from the head alone, or never."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    lines = [f"POST {parts.path}{path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    answer_headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), answer_headers, body


# -- the checks -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    run: Callable[[At, str | None], None]
    promises: tuple[Promise, ...]
    kinds: frozenset[str]
    each_path: bool  # run once for each path the first promise's row lists


CHECKS: dict[str, Check] = {}


def check(*promises: Promise, kinds: str = "gym written", each_path: bool = False) -> Callable[..., Any]:
    def register(run: Callable[[At, str | None], None]) -> Callable[[At, str | None], None]:
        CHECKS[run.__name__] = Check(run, promises, frozenset(kinds.split()), each_path)
        return run

    return register


# Answers every route may give


@check((ANY, "401", 401), kinds="gym written gateway")
def token_needed(at: At, path: str | None) -> None:
    asked = (
        [("GET", "/", None)] if at.kind == "gateway" else [("POST", "/seed_session", at.row), ("GET", "/metrics", None)]
    )
    for token in (None, "a-wrong-token"):
        with at.client(token=token) as http:
            for method, route, body in asked:
                answer = http.request(method, route, json=body)
                refusal(answer, 401)
                assert answer.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in answer.text
                assert token is None or token not in answer.text, "a token is never echoed"


@check((ANY, "413", 413))
def body_too_large(at: At, path: str | None) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, answer_headers, body = raw_post(at.url, at.tool[0], {**headers, "Content-Length": str(MAX_BODY_BYTES + 1)})
    assert (status, answer_headers["content-type"]) == (413, "application/json"), body
    assert str(MAX_BODY_BYTES) in json.loads(body)["detail"]


def _refused_400(at: At, body: bytes, content_type: str = "application/json") -> None:
    with at.client() as http:
        refusal(http.post("/aggregate_metrics", content=body, headers={"content-type": content_type}), 400)


@check((ANY, "400", 400))
def nested_too_deep(at: At, path: str | None) -> None:
    _refused_400(at, b"[" * 129 + b"]" * 129)
    with at.client() as http:  # at the limit, it is the route's to answer
        at_the_limit = b"[" * 128 + b"]" * 128
        assert http.post("/aggregate_metrics", content=at_the_limit).status_code == 422


@check((ANY, "400", 400))
def lone_surrogate(at: At, path: str | None) -> None:
    _refused_400(at, b'{"city": "\\ud800"}')


@check((ANY, "400", 400))
def nan(at: At, path: str | None) -> None:
    _refused_400(at, b'{"city": NaN}')


@check((ANY, "400", 400))
def infinity(at: At, path: str | None) -> None:
    _refused_400(at, b'{"city": -Infinity}')


@check((ANY, "400", 400))
def not_utf8(at: At, path: str | None) -> None:
    _refused_400(at, b'{"city": "\xff"}')
    _refused_400(at, b"caf\xe9", "text/plain")


@check((ANY, "422", 422))
def validation_is_fastapis_422(at: At, path: str | None) -> None:
    with at.client() as http:
        answer = http.post("/aggregate_metrics", json={"verify_responses": 3})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", "verify_responses"]


@check((ANY, "500", 500), kinds="gym")
def raised_is_gyms_500(at: At, path: str | None) -> None:
    """Gym's own /aggregate_metrics raises on two verify responses with one rollout key (0.4.0 and 0.7.0 alike)."""
    with at.client() as http:
        answer = http.post("/aggregate_metrics", json={"verify_responses": [{}, {}]})
    assert answer.status_code == 500, answer.text
    assert re.fullmatch(r"[A-Za-z]+Error\(.*\)", answer.json()), answer.text  # repr(e), as a JSON string


@check((ANY, "410", 410), (GYM, "POST /<tool>", 410))
def tool_call_of_a_gone_owner(at: At, path: str | None) -> None:
    with episode(at) as http:
        with at.peer(http.cookies) as elsewhere:
            body = refusal(elsewhere.post(at.tool[0], json=at.tool[1]), 410)
        assert body["failure_kind"] == "session_lost"
        assert body["owner"]["replica"], body
        assert http.post(at.tool[0], json=at.tool[1]).status_code == 200, "its owner still plays it"


# Gym's routes


@check((GYM, "POST /seed_session", 200))
def seed_sets_the_session_cookie(at: At, path: str | None) -> None:
    with at.client() as http:
        answer = http.post("/seed_session", json=at.row)
        try:
            assert answer.status_code == 200, answer.text
            (cookie,) = http.cookies.jar
            assert cookie.path == at.mount
            assert "httponly" in answer.headers["set-cookie"].lower()
        finally:
            close(at, http)


@check((GYM, "POST /<tool>", 200), (WRITTEN_ROUTES, "POST /<tool>", 200))
def tool_call(at: At, path: str | None) -> None:
    with episode(at) as http:
        answer = http.post(at.tool[0], json=at.tool[1])
    assert answer.status_code == 200, answer.text
    if at.kind == "gym":
        assert answer.json() == {"city": "Paris", "weather_description": "The weather in Paris is cold."}
    else:  # the tool's text
        assert answer.headers["content-type"].startswith("text/plain")
        assert json.loads(answer.text)["pos"] == [0, 0]


@check((GYM, "POST /verify", 200), (WRITTEN_ROUTES, "POST /verify", 200))
def verify_answers_the_verdict(at: At, path: str | None) -> None:
    with episode(at) as http:
        answer = http.post("/verify", json=verify_body(at.row))
    assert answer.status_code == 200, answer.text
    verdict = answer.json()
    assert isinstance(verdict["reward"], float)
    if at.kind == "written":
        assert {"reward", "criteria", "mask_sample", "failure_kind", "failure_reason"} <= set(verdict)
        assert (verdict["mask_sample"], verdict["failure_kind"]) == (False, None)
    else:  # Gym's own servers verify whatever they are sent
        with at.client() as stranger:
            unseeded = stranger.post("/verify", json=verify_body(at.row))
        assert unseeded.status_code == 200, unseeded.text
        assert isinstance(unseeded.json()["reward"], float)


@check((GYM, "POST /verify", 410), (MASKED, "410", 410))
def verify_of_a_gone_owner(at: At, path: str | None) -> None:
    with episode(at) as http, at.peer(http.cookies) as elsewhere:
        body = refusal(elsewhere.post("/verify", json=verify_body(at.row)), 410)
    assert body["failure_kind"] == "session_lost"
    assert (body["verdict"]["mask_sample"], body["verdict"]["reward"]) == (True, 0.0)


@check((GYM, "POST /close_session", 200), (WRITTEN_ROUTES, "POST /close_session", 200))
def close_ends_the_episode(at: At, path: str | None) -> None:
    with at.client() as http:
        assert http.post("/seed_session", json=at.row).status_code == 200
        closed = close(at, http)
        if closed is None:  # nemo-gym 0.4.0's Gym servers: none, as the reference says (0.5+)
            assert http.post("/close_session", json={}).status_code == 404
            return
        assert closed.status_code == 200, closed.text
        if at.kind == "written":
            assert http.post(at.tool[0], json=at.tool[1]).status_code == 409, "the episode has ended"


@check((GYM, "POST /close_session", 410), kinds="written" + (" gym" if GYM_VERSION >= (0, 5) else ""))
def close_of_a_gone_owner(at: At, path: str | None) -> None:
    with episode(at) as http, at.peer(http.cookies) as elsewhere:
        closed = close(at, elsewhere)
    assert closed is not None
    assert refusal(closed, 410)["failure_kind"] == "session_lost"


@check((GYM, "POST /aggregate_metrics", 200), (WRITTEN_ROUTES, "POST /aggregate_metrics", 200))
def aggregate_metrics_needs_no_session(at: At, path: str | None) -> None:
    with episode(at) as http:
        verdict = http.post("/verify", json=verify_body(at.row)).json()
    with at.client() as sessionless:
        answer = sessionless.post(
            "/aggregate_metrics", json={"verify_responses": [{**verdict, "_ng_task_index": 0, "_ng_rollout_index": 0}]}
        )
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["group_level_metrics"]) == 1


@check((GYM, "/docs, /openapi.json", 200), each_path=True)
def openapi_docs(at: At, path: str | None) -> None:
    assert path is not None
    with at.client() as http:
        answer = http.get(path)
    assert answer.status_code == 200, answer.text
    if path.endswith(".json"):
        assert at.tool[0] in answer.json()["paths"]
    else:
        assert answer.headers["content-type"].startswith("text/html")


@check((GYM, "/ng-rollout/<id>/...", 200))
def under_a_rollout_context(at: At, path: str | None) -> None:
    with at.client(url=f"{at.url}/ng-rollout/rollout-1") as http:
        seeded = http.post("/seed_session", json=at.row)
        if GYM_VERSION < (0, 5):
            assert seeded.status_code == 404, "nemo-gym 0.4.0 has no rollout context (0.5+)"
            return
        try:
            assert seeded.status_code == 200, seeded.text
            assert http.post(at.tool[0], json=at.tool[1]).status_code == 200
        finally:
            close(at, http)


# gymhost's routes


@check((OWN, "GET /, /health, /healthz, /livez", 200), each_path=True)
def liveness(at: At, path: str | None) -> None:
    assert path is not None
    with at.client(token=None) as http:
        answer = http.get(path)
        assert (answer.status_code, answer.json()) == (200, {"status": "ok"}), answer.text
        assert http.head(path).status_code == 200


@check((OWN, "GET /readyz", 200))
def readiness(at: At, path: str | None) -> None:
    with at.client(token=None) as http:
        answer = http.get("/readyz")
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"}), answer.text


def scrape(http: httpx.Client) -> set[str | None]:
    """``/metrics`` in Prometheus' text format: the mounts its series carry."""
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    media, *parameters = (part.strip() for part in answer.headers["content-type"].split(";"))
    assert media == "text/plain"
    assert any(parameter.startswith("version=") for parameter in parameters), answer.headers["content-type"]
    families = list(text_string_to_metric_families(answer.text))
    assert families
    return {sample.labels.get("mount") for family in families for sample in family.samples}


@check((OWN, "GET /metrics", 200))
def metrics(at: At, path: str | None) -> None:
    with at.client() as http:
        assert scrape(http) - {None} == {at.mount}, "a server's own series, under its mount"
    with at.client(token=None) as http:
        refusal(http.get("/metrics"), 401)


# A written server's routes


@check((WRITTEN_ROUTES, "POST /seed_session", 200), kinds="written")
def written_seed_answers_its_task(at: At, path: str | None) -> None:
    with at.client() as http:
        answer = http.post("/seed_session", json=at.row)
        close(at, http)
    assert (answer.status_code, answer.json()) == (200, {"task_id": at.row["task_id"]}), answer.text


@check((WRITTEN_ROUTES, "POST /seed_session", 404), kinds="written")
def written_seed_of_an_unknown_task(at: At, path: str | None) -> None:
    with at.client() as http:
        body = refusal(http.post("/seed_session", json={**at.row, "task_id": "no-such-task"}), 404)
    assert "no-such-task" in body["detail"]


@check((WRITTEN_ROUTES, "POST /seed_session", 409), kinds="written")
def written_seed_of_another_task(at: At, path: str | None) -> None:
    with episode(at) as http:
        refusal(http.post("/seed_session", json=at.rows[1]), 409)


@check((WRITTEN_ROUTES, "POST /<tool>", 400), kinds="written")
def written_tool_error(at: At, path: str | None) -> None:
    with episode(at) as http:
        answer = http.post(f"/{WRITTEN}_move", json={"direction": "down"})  # off the grid's edge
    assert answer.status_code == 400, answer.text
    assert answer.text.startswith("blocked: "), "the tool's own error, for the model"


@check((WRITTEN_ROUTES, "POST /<tool>", 400), kinds="written")
def written_tool_arguments_not_an_object(at: At, path: str | None) -> None:
    with episode(at) as http:
        refusal(http.post(f"/{WRITTEN}_move", json=["down"]), 400)


@check((WRITTEN_ROUTES, "POST /<tool>", 404), kinds="written")
def written_unknown_tool(at: At, path: str | None) -> None:
    with episode(at) as http:
        body = refusal(http.post("/no_such_tool", json={}), 404)
    assert f"{WRITTEN}_look, {WRITTEN}_move" in body["detail"], "it names its tools"


@check((WRITTEN_ROUTES, "POST /<tool>", 409), kinds="written")
def written_tool_without_an_episode(at: At, path: str | None) -> None:
    with at.client() as http:
        refusal(http.post(at.tool[0], json=at.tool[1]), 409)


@check((WRITTEN_ROUTES, "POST /verify", 409), kinds="written")
def written_verify_with_nothing_to_grade(at: At, path: str | None) -> None:
    with at.client() as never_seeded:
        refusal(never_seeded.post("/verify", json=verify_body(at.row)), 409)
    with episode(at) as http:
        first = http.post("/verify", json=verify_body(at.row))
        assert first.status_code == 200, first.text
        again = refusal(http.post("/verify", json=verify_body(at.row)), 409)
    first_verdict = {key: first.json()[key] for key in again["verdict"]}
    assert again["verdict"] == first_verdict, "the first verdict, under verdict"
    with at.client() as http:
        assert http.post("/seed_session", json=at.row).status_code == 200
        assert close(at, http) is not None
        refusal(http.post("/verify", json=verify_body(at.row)), 409)


@check((WRITTEN_ROUTES, "POST /aggregate_metrics", 422), kinds="written")
def written_aggregate_metrics_it_cannot_aggregate(at: At, path: str | None) -> None:
    with at.client() as http:
        refusal(http.post("/aggregate_metrics", json={"verify_responses": [{}, {}]}), 422)


@check((WRITTEN_ROUTES, "GET /agentenv/pool", 200), kinds="written")
def written_pool(at: At, path: str | None) -> None:
    with at.client() as http:
        answer = http.get("/agentenv/pool")
    assert answer.status_code == 200, answer.text
    status = answer.json()
    assert {"instances", "waiting_seeds", "open_episodes", "limits", "counters"} <= set(status), status
    assert {"free", "leased", "starting"} <= set(status), "the instances by state"
    assert status["limits"]["min_instances"] == 1


INSTANCE = (WRITTEN_ROUTES, "GET /agentenv/pool/{index}")


@check((*INSTANCE, 200), (*INSTANCE, 404), kinds="written")
def written_instance(at: At, path: str | None) -> None:
    with at.client() as http:
        # One the pool has now (process instances serve one episode each: the first ones are long replaced).
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while not (instances := http.get("/agentenv/pool").json()["instances"]):
            assert time.monotonic() < deadline, "the pool has no instance"
            time.sleep(0.05)
        index = instances[0]["index"]
        answer = http.get(f"/agentenv/pool/{index}")
        assert answer.status_code == 200, answer.text
        instance = answer.json()
        assert (instance["index"], instance["url"]) == (index, f"http://instance-{index}"), instance
        assert "data" in instance, "its state, as its data/get answers it"
        refusal(http.get("/agentenv/pool/999999"), 404)


# A gateway's routes


@check((GATEWAY, "GET /", 200), kinds="gateway")
def gateway_lists_its_servers(at: At, path: str | None) -> None:
    with at.client() as http:
        answer = http.get("/")
    assert answer.status_code == 200, answer.text
    servers = {server["prefix"]: server for server in answer.json()["servers"]}
    assert {prefix: server["tools"] for prefix, server in servers.items()} == {
        f"/{GYM_EXAMPLE}": ["get_weather"],
        f"/{WRITTEN}": [f"{WRITTEN}_look", f"{WRITTEN}_move"],
    }
    for server in servers.values():
        assert server["name"], server
        assert Path(server["folder"]).is_dir(), server
        assert server["mcp"] is False, server
    with at.client(token=None) as http:
        refusal(http.get("/"), 401)


@check((GATEWAY, "GET /livez, /healthz, /health", 200), kinds="gateway", each_path=True)
def gateway_liveness(at: At, path: str | None) -> None:
    assert path is not None
    with at.client(token=None) as http:
        answer = http.get(path)
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"}), answer.text


@check((GATEWAY, "GET /readyz", 200), kinds="gateway")
def gateway_readiness(at: At, path: str | None) -> None:
    with at.client(token=None) as http:
        answer = http.get("/readyz")
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"}), answer.text


@check((GATEWAY, "GET /metrics", 200), kinds="gateway")
def gateway_metrics(at: At, path: str | None) -> None:
    with at.client() as http:
        assert {f"/{GYM_EXAMPLE}", f"/{WRITTEN}"} <= scrape(http)
    with at.client(token=None) as http:
        refusal(http.get("/metrics"), 401)


@check((GATEWAY, "/<name>/...", 200), kinds="gateway")
def gateway_mounts_answer_their_own_routes(at: At, path: str | None) -> None:
    with at.client() as http:
        for server in http.get("/").json()["servers"]:
            answer = http.get(f"{server['prefix']}/openapi.json")
            assert answer.status_code == 200, answer.text
            assert {f"/{tool}" for tool in server["tools"]} <= set(answer.json()["paths"])


# Promises held by other tests: the reference's row, and the tests that hold it.
ELSEWHERE: dict[Promise, tuple[str, ...]] = {
    (ANY, "503", 503): ("tests/test_forwarding.py::test_an_owner_busy_past_the_patience_is_busy_not_gone",),
    (GYM, "POST /seed_session", 503): (
        "tests/test_operating.py::test_readiness_follows_the_pool_and_a_drain_lets_open_episodes_finish",
    ),
    (GYM, "/mcp", 200): ("tests/test_processes.py::test_mcp_through_a_real_server",),
    (GYM, "/mcp", 410): ("tests/test_operating.py::test_an_mcp_token_of_another_replica_is_410",),
    (GYM, "POST /reset, POST /step", 200): (
        "tests/test_gym_folders.py::test_a_gymnasium_style_episode_is_followed_from_reset_to_its_last_step",
    ),
    (GYM, "POST /reset, POST /step", 503): (
        "tests/test_gym_folders.py::test_a_drain_waits_for_a_gymnasium_episode_and_takes_no_new_one",
    ),
    (GYM, "POST /reset, POST /step", 410): (
        "tests/test_gym_folders.py::test_a_gymnasium_step_on_another_replica_is_answered_as_lost",
    ),
    # Here, session_lost; there, every kind of each status.
    (MASKED, "410", 410): (
        "tests/test_masked_verdicts_unit.py::test_a_masked_verdict_is_refused_with_its_verdict_and_counted",
    ),
    (MASKED, "503, with Retry-After", 503): (
        "tests/test_masked_verdicts_unit.py::test_a_masked_verdict_is_refused_with_its_verdict_and_counted",
    ),
    (MASKED, "502", 502): (
        "tests/test_masked_verdicts_unit.py::test_a_masked_verdict_is_refused_with_its_verdict_and_counted",
    ),
    (OWN, "GET /readyz", 503): (
        "tests/test_reference.py::test_apps_and_gateways_not_started_are_not_ready",
        "tests/test_operating.py::test_readiness_follows_the_pool_and_a_drain_lets_open_episodes_finish",
    ),
    (GATEWAY, "GET /readyz", 503): ("tests/test_reference.py::test_apps_and_gateways_not_started_are_not_ready",),
    (WRITTEN_ROUTES, "POST /seed_session", 503): (
        "tests/test_agentenv_server.py::test_seeds_wait_for_a_lease_visibly_then_answer_503_naming_the_limit",
        "tests/test_reference.py::test_apps_and_gateways_not_started_are_not_ready",
    ),
    (WRITTEN_ROUTES, "POST /close_session", 409): (
        "tests/test_agentenv_server.py::test_a_model_cannot_move_its_episode_to_a_task_of_its_choice_or_end_another",
    ),
    (WRITTEN_ROUTES, "POST /<tool>", 503): (
        "tests/test_agentenv_server.py::test_killing_the_leased_instance_masks_the_episode_and_the_pool_recovers",
    ),
}


def _cases() -> Iterator[Any]:
    paths = documented()
    for name, each in CHECKS.items():
        for target in TARGETS.values():
            if target.kind not in each.kinds:
                continue
            for path in paths.get(each.promises[0], ()) if each.each_path else (None,):
                yield pytest.param(name, target.name, path, id=f"{name}-{target.name}" + (path or ""))


@pytest.mark.parametrize(("check_name", "target", "path"), list(_cases()))
def test_the_reference_holds(servers: Servers, check_name: str, target: str, path: str | None) -> None:
    CHECKS[check_name].run(reach(servers, target), path)


def test_every_documented_promise_is_held() -> None:
    promised = set(documented())
    checked = {promise for each in CHECKS.values() for promise in each.promises}
    held = checked | set(ELSEWHERE)
    assert sorted(promised - held) == [], "promises of docs/reference/http.md that no test holds"
    assert sorted(held - promised) == [], "promises held here that docs/reference/http.md does not make"
    for tests in ELSEWHERE.values():
        for test in tests:
            file, _, name = test.partition("::")
            source = (REPO / file).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), f"{test}: no such test"


async def _not_ready(app: Any, seed: dict[str, Any] | None = None) -> tuple[httpx.Response, httpx.Response | None]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reference.test") as http:
        ready = await http.get("/readyz")
        seeded = await http.post("/seed_session", json=seed) if seed is not None else None
    return ready, seeded


@pytest.mark.anyio
@pytest.mark.usefixtures("clean_env")
async def test_apps_and_gateways_not_started_are_not_ready(tmp_path: Path, gym_root: Path) -> None:
    """An app (or a gateway) whose lifespan has not started: /readyz is 503 with a JSON reason (a gateway's names
    each mount), and a written server's seed is 503: its pool is not running."""
    from gymhost import NO_TOKEN, create_app, create_gateway

    folder = (await awrite_folder(str(GRIDSIM), tmp_path, name=WRITTEN, instances=1)).path
    row = _rows(folder, "written")[0]
    ready, seeded = await _not_ready(create_app(folder, token=NO_TOKEN), row)
    assert ready.status_code == 503
    assert ready.json()["reason"].startswith("starting: "), ready.json()
    assert seeded is not None
    assert refusal(seeded, 503)["detail"].startswith("the environment pool is not running")
    shutil.copytree(gym_root / GYM_EXAMPLE, tmp_path / "resources_servers" / GYM_EXAMPLE)
    ready, _ = await _not_ready(create_gateway(tmp_path, token=NO_TOKEN))
    assert ready.status_code == 503
    reasons = ready.json()["reason"]
    assert set(reasons) == {f"/{GYM_EXAMPLE}", f"/{WRITTEN}"}, reasons
    assert all(reason.startswith("starting: ") for reason in reasons.values()), reasons
