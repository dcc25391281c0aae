"""The middleware an app gets, in the order ``gymhost.middleware.stack.middleware_stack`` documents, on each
nemo-gym version, and what that order means for a client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import create_app

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

EXAMPLE = "example_single_tool_call"
TOKEN = "stack-token"


def built_chain(app: Any) -> list[str]:
    """The classes a request passes through, outermost first, as Starlette builds them for the first request."""
    names: list[str] = []
    layer = app.build_middleware_stack()
    while hasattr(layer, "app") or hasattr(layer, "_app"):  # nemo-gym's rollout middleware keeps `_app`
        names.append(type(layer).__name__)
        layer = layer.app if hasattr(layer, "app") else layer._app
    return names


def test_the_stack_is_the_documented_one(gym_root: Path, gym_version: tuple[int, ...]) -> None:
    app = create_app(gym_root / EXAMPLE, token=TOKEN)
    ours = ["HttpMetricsMiddleware", "BearerTokenMiddleware", "RequestGuardMiddleware"]
    if gym_version >= (0, 5):
        gyms = ["DisconnectCancellationMiddleware", "GymErrorsMiddleware", "MountedRolloutContextMiddleware"]
    else:
        gyms = ["GymErrorsMiddleware"]
    episodes = [
        "MaskedVerdictsMiddleware",
        "DrainingMiddleware",
        "SessionOwnershipMiddleware",
        "EpisodeTrackingMiddleware",
    ]
    expected = ours + gyms + ["GymSessionMiddleware", *episodes]
    assert [m.cls.__name__ for m in app.user_middleware] == expected
    # Starlette and FastAPI put their own layers around the user's (error pages, telemetry) and below them (the
    # exception handlers): gymhost's run together, in the documented order.
    chain = built_chain(app)
    start = chain.index(expected[0])
    assert chain[start : start + len(expected)] == expected, chain
    assert chain[0] == "ServerErrorMiddleware"
    assert "BaseHTTPMiddleware" not in chain, "every layer is pure ASGI"


def test_masked_verdicts_answered_leave_the_rule_out_and_a_written_servers_own_layer_is_replaced(
    gym_root: Path, tmp_path: Path
) -> None:
    """A written server brings the rule for Gym's launcher (``launcher_mode``); gymhost places one layer of its own,
    as its setting says, whatever the server brought."""
    from gymhost.environments import write_folder

    from .agentenv_helpers import GRIDSIM

    assert "MaskedVerdictsMiddleware" not in layers(create_app(gym_root / EXAMPLE, masked_verdicts="answer"))
    written = write_folder(str(GRIDSIM), tmp_path).path
    assert layers(create_app(written)).count("MaskedVerdictsMiddleware") == 1
    assert "MaskedVerdictsMiddleware" not in layers(create_app(written, masked_verdicts="answer"))


def layers(app: Any) -> list[str]:
    return [m.cls.__name__ for m in app.user_middleware]


def test_without_a_token_or_http_metrics_the_guard_is_outermost(gym_root: Path) -> None:
    from gymhost import NO_TOKEN

    app = create_app(gym_root / EXAMPLE, token=NO_TOKEN, metrics=False)
    assert app.user_middleware[0].cls.__name__ == "RequestGuardMiddleware"


async def test_a_request_without_the_token_is_refused_before_its_body_is_read(gym_root: Path) -> None:
    """The token layer sits outside the request guard: an anonymous 100 MB body is a 401, never a 413."""
    app = create_app(gym_root / EXAMPLE, token=TOKEN, max_body_bytes=1024)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stack.test") as client:
        anonymous = await client.post("/seed_session", content=b"x" * 4096, headers={"content-type": "text/plain"})
        assert anonymous.status_code == 401
        signed = await client.post(
            "/seed_session",
            content=b"x" * 4096,
            headers={"content-type": "text/plain", "authorization": f"Bearer {TOKEN}"},
        )
        assert signed.status_code == 413
