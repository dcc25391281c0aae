"""The request profile's attribution of py-spy's samples to pieces (no sampling here: `make bench-request-profile`
measures)."""

from __future__ import annotations

import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.unit

sys.path.insert(0, str(REPO / "benchmarks"))
import request_profile as profile  # noqa: E402

LAYERS = {"gymhost/middleware/metrics.py": "HttpMetricsMiddleware", "gymhost/_sessions/_cookie.py": "Cookie"}
SERVE = "run (asyncio/runners.py:118);RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py:422)"
LIFESPAN = "LifespanRunner.__call__ (gymhost/_hosting/_lifespan.py:83)"
METRICS = "HttpMetricsMiddleware.__call__ (gymhost/middleware/metrics.py:53)"
COOKIE = "GymSessionMiddleware.__call__ (gymhost/_sessions/_cookie.py:116)"
ROUTER = "Router.__call__ (starlette/routing.py:683)"


def placed(*stacks: str) -> dict[str, int]:
    counts, _ = profile.attribute("\n".join(f"{stack} 1" for stack in stacks), LAYERS)
    return dict(counts)


def test_a_layers_own_frames_are_the_layers() -> None:
    assert placed(f"{SERVE};{LIFESPAN};{METRICS}") == {"HttpMetricsMiddleware": 1}


def test_the_innermost_layer_wins() -> None:
    assert placed(f"{SERVE};{LIFESPAN};{METRICS};{COOKIE}") == {"Cookie": 1}


def test_a_library_or_gymhost_helper_a_layer_calls_counts_for_the_layer() -> None:
    helpers = [
        "dumps (json/__init__.py:238)",
        "Event.set (asyncio/locks.py:192)",
        "MutexValue.inc (prometheus_client/values.py:28)",
        "replay_first.<locals>.replayed (gymhost/_asgi.py:50);receive (json/decoder.py:20)",
    ]
    assert placed(*(f"{SERVE};{LIFESPAN};{METRICS};{helper}" for helper in helpers)) == {"HttpMetricsMiddleware": 4}


def test_gymhost_outside_its_layers_is_its_own_piece_when_something_else_called_it() -> None:
    assert placed(f"{SERVE};{LIFESPAN}", f"{SERVE};{LIFESPAN};dumps (json/__init__.py:238)") == {
        profile.GYMHOST_OTHER: 2
    }


def test_the_framework_the_app_and_the_server_are_theirs_even_below_a_layer() -> None:
    assert placed(
        f"{SERVE};{METRICS};{ROUTER}",
        f"{SERVE};{METRICS};{ROUTER};Session.__setitem__ (starlette/middleware/sessions.py:30)",
        f"{SERVE};{COOKIE};{ROUTER};SimpleWeatherResourcesServer.get_weather (app.py:98)",
        f"{SERVE};{METRICS};RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:463)",
        SERVE,
    ) == {profile.FRAMEWORK: 2, profile.APP: 1, profile.SERVER: 2}


def test_a_frame_without_its_line_is_placed_by_its_file() -> None:
    assert placed(f"{SERVE};HttpMetricsMiddleware.__call__ (gymhost/middleware/metrics.py)") == {
        "HttpMetricsMiddleware": 1
    }


def test_samples_of_no_piece_are_counted_and_kept_to_look_at() -> None:
    counts, unplaced = profile.attribute(" 3\naclosing.__aexit__ (contextlib.py:390) 2\nnot a line\n", LAYERS)
    assert counts == {profile.OTHER: 5}
    assert unplaced == {"(no Python frame)": 3, "aclosing.__aexit__ (contextlib.py:390)": 2}
