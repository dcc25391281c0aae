"""The rule for masked verdicts (``middleware.masked_verdicts``) on a plain Starlette app, without nemo-gym: what a
client sees of each verdict, and what the metrics count."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route

from gymhost import ServeError
from gymhost._config import AppSettings, resolve_masked_verdicts
from gymhost._metrics import EpisodeMetrics
from gymhost.middleware.masked_verdicts import MaskedVerdictsMiddleware

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


def masked(kind: str) -> dict[str, Any]:
    return {"task_id": "t", "reward": 0.0, "mask_sample": True, "failure_kind": kind, "failure_reason": f"{kind}!"}


async def verify(request: Request) -> Response:
    """Answers whatever verdict the request names, in pieces when asked, as a server would."""
    asked = json.loads(await request.body())
    body = json.dumps(asked["answer"]).encode()
    status = asked.get("status", 200)
    if asked.get("pieces"):
        chunks = [body[i : i + 7] for i in range(0, len(body), 7)]

        async def stream() -> Any:
            for chunk in chunks:
                yield chunk

        return StreamingResponse(stream(), status_code=status, media_type="application/json")
    return Response(body, status_code=status, media_type="application/json", headers={"x-server": "kept"})


def app(mount: str = "/") -> tuple[Any, EpisodeMetrics]:
    metrics = EpisodeMetrics()
    metrics.bind(mount)
    inner = Starlette(routes=[Route("/verify", verify, methods=["POST"]), Route("/other", verify, methods=["POST"])])
    wrapped = MaskedVerdictsMiddleware(inner, metrics=metrics)
    return (wrapped if mount == "/" else Starlette(routes=[Mount(mount, wrapped)])), metrics


async def post(asgi: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://rule.test") as client:
        return await client.post(path, json=body)


def refused_count(mount: str, kind: str) -> float:
    value = REGISTRY.get_sample_value("gymhost_masked_verdicts_refused_total", {"mount": mount, "failure_kind": kind})
    return value or 0.0


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("session_lost", 410),
        ("session_expired", 410),
        ("cancelled", 410),
        ("provider_unavailable", 503),
        ("shutdown", 503),
        ("judge_failed", 502),
        ("transport_peer_drop", 502),
        ("openenv:environment_error", 502),
    ],
)
@pytest.mark.parametrize("pieces", [False, True])
async def test_a_masked_verdict_is_refused_with_its_verdict_and_counted(kind: str, status: int, pieces: bool) -> None:
    asgi, _ = app()
    before = refused_count("/", kind)
    answer = await post(asgi, "/verify", {"answer": masked(kind), "pieces": pieces})
    assert answer.status_code == status, answer.text
    assert answer.json() == {
        "detail": f"no reward: the episode was masked ({kind}): {kind}!",
        "failure_kind": kind,
        "verdict": {"reward": 0.0, "mask_sample": True, "failure_kind": kind, "failure_reason": f"{kind}!"},
    }
    assert answer.headers.get("retry-after") == ("1" if status == 503 else None)
    assert refused_count("/", kind) == before + 1


@pytest.mark.parametrize(
    "verdict",
    [
        {"reward": 0.0, "mask_sample": False},
        {"reward": 1.0},
        {"reward": 0.0, "note": "mask_sample is not set here"},
        {"reward": 0.0, "mask_sample": "true"},  # not a masked verdict: JSON's true only
        [1, 2, 3],
    ],
)
@pytest.mark.parametrize("pieces", [False, True])
async def test_every_other_verdict_passes_as_the_server_answered_it(verdict: Any, pieces: bool) -> None:
    asgi, _ = app()
    answer = await post(asgi, "/verify", {"answer": verdict, "pieces": pieces})
    assert (answer.status_code, answer.json()) == (200, verdict)
    if not pieces:
        assert answer.headers["x-server"] == "kept"


async def test_errors_and_other_routes_pass_untouched() -> None:
    asgi, _ = app()
    refused = await post(asgi, "/verify", {"answer": masked("session_lost"), "status": 409})
    assert (refused.status_code, refused.json()) == (409, masked("session_lost"))
    other = await post(asgi, "/other", {"answer": masked("session_lost")})
    assert (other.status_code, other.json()) == (200, masked("session_lost"))


async def test_under_a_mount_the_verify_below_it_is_ruled_and_counted_under_its_mount() -> None:
    asgi, _ = app("/quiz")
    before = refused_count("/quiz", "judge_failed")
    answer = await post(asgi, "/quiz/verify", {"answer": masked("judge_failed")})
    assert answer.status_code == 502
    assert refused_count("/quiz", "judge_failed") == before + 1


def test_the_setting_defaults_to_refuse_reads_its_variable_and_names_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GYMHOST_MASKED_VERDICTS", raising=False)
    assert AppSettings.of().masked_verdicts == "refuse"
    assert AppSettings().masked_verdicts == "refuse"
    monkeypatch.setenv("GYMHOST_MASKED_VERDICTS", "answer")
    assert AppSettings.of().masked_verdicts == "answer"
    assert AppSettings.of(masked_verdicts="refuse").masked_verdicts == "refuse"
    monkeypatch.setenv("GYMHOST_MASKED_VERDICTS", "mask")
    with pytest.raises(ServeError, match=r"GYMHOST_MASKED_VERDICTS is 'mask'; expected one of: refuse, answer"):
        AppSettings.of()
    with pytest.raises(ServeError, match=r"masked_verdicts is 'yes'; expected one of: refuse, answer"):
        resolve_masked_verdicts("yes")
