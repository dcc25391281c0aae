"""``gymhost top``'s arithmetic: latency quantiles as Prometheus' ``histogram_quantile`` computes them (the alert
rules' unit tests hold the same numbers), rates over the interval between two readings, and no rate across a
restart."""

from __future__ import annotations

import pytest

from gymhost._watching import Reading, compare

pytestmark = pytest.mark.unit

INF = float("inf")


NOT_CALLS = ("/verify", "/seed_session", "/close_session", "/", "(forwarded)", "(unmatched)", "/metrics")


def reading(at: float, calls: dict[float, float], seeds: float, others: float = 9.0) -> Reading:
    """A server's reading: tool calls on /get_weather by bucket, and ``others`` requests on every route that is not
    a tool call (a verify, a seed, one another process answered...), all in its slowest bucket."""
    bucket = "http_server_request_duration_seconds_bucket"
    samples = {(bucket, frozenset({("http_route", "/get_weather"), ("le", str(le))})): n for le, n in calls.items()}
    for route in NOT_CALLS:
        samples[(bucket, frozenset({("http_route", route), ("le", "+Inf")}))] = others
    samples[("gymhost_sessions_started_total", frozenset({("mount", "/")}))] = seeds
    return Reading("http://replica", at, "ready", samples)


def test_rates_and_quantiles_over_the_interval() -> None:
    before = reading(10.0, {2.5: 0, 5.0: 0, INF: 0}, seeds=4)
    view = compare(before, reading(12.0, {2.5: 0, 5.0: 10, INF: 10}, seeds=8, others=29))
    assert view.calls_per_s == 5.0, "seeds, verifies, closes, forwarded and the operator's routes are not tool calls"
    assert view.seeds_per_s == 2.0
    assert view.call_p99_s == pytest.approx(4.975)  # promtool's answer for the same buckets (gymhost-alerts.test.yaml)
    assert view.call_p50_s == pytest.approx(3.75)


def test_a_quantile_past_the_last_finite_bound_is_that_bound_and_no_call_is_none() -> None:
    before = reading(0.0, {0.01: 0, INF: 0}, seeds=0)
    assert compare(before, reading(1.0, {0.01: 0, INF: 3}, seeds=0)).call_p99_s == 0.01
    idle = compare(before, reading(1.0, {0.01: 0, INF: 0}, seeds=0))
    assert idle.call_p99_s is None
    assert idle.calls_per_s == 0.0


def test_no_rate_across_a_restart_or_without_a_first_reading() -> None:
    before = reading(0.0, {INF: 50}, seeds=20)
    restarted = compare(before, reading(1.0, {INF: 3}, seeds=1))
    assert (restarted.calls_per_s, restarted.seeds_per_s, restarted.call_p99_s) == (None, None, None)
    busier = compare(before, reading(1.0, {INF: 80}, seeds=30, others=2))  # served more since, but one counter fell
    assert (busier.calls_per_s, busier.seeds_per_s) == (None, None)
    assert compare(None, reading(1.0, {INF: 3}, seeds=1)).calls_per_s is None
