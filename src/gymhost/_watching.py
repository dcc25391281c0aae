"""What ``gymhost top`` shows of a running server: its ``/metrics`` and ``/readyz`` read, and two readings compared.

A reading is what a server exports at one moment; rates and latencies come from the difference between two
readings (counters and histogram buckets that only grow), as Prometheus' ``rate`` and ``histogram_quantile`` compute
them, so ``top`` needs nothing the server does not already export. A server that restarted between two readings
(a counter went down) shows its totals since the restart and no rates for that interval.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ._drain import NOT_READY

__all__ = ["NOT_TOOL_CALLS", "Reading", "View", "compare", "read"]

# The routes that are not the model's tool calls: an episode's own (seed, verify, close; a gymnasium server's
# reset) and the operator's. The same set as the GymhostSlowToolCalls alert (deploy/prometheus/gymhost-alerts.yaml).
_EPISODE_AND_OPERATOR = ("seed_session", "verify", "close_session", "reset", "metrics", "healthz", "readyz", "livez")
# "": "/"; "(unmatched)": a path no route took; "(forwarded)": a request another process answered (counted there).
NOT_TOOL_CALLS = frozenset({*_EPISODE_AND_OPERATOR, "health", "", "(unmatched)", "(forwarded)"})
_DURATION = "http_server_request_duration_seconds"

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Reading:
    """One server's metrics at one moment (``at``: ``time.monotonic()``), or why it could not be read."""

    url: str
    at: float
    state: str  # "ready", "draining", "not ready: ...", or "no answer: ..."
    samples: Mapping[tuple[str, Labels], float] = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        """Its metrics were read: a server that answered nothing, or refused its metrics, has none to show."""
        return bool(self.samples) or not (self.state.startswith("no answer") or "/metrics refused" in self.state)

    def total(self, name: str, **labels: str) -> float:
        wanted = set(labels.items())
        return sum(value for (sample, have), value in self.samples.items() if sample == name and wanted <= have)

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """``name``'s values summed by one label's value (over mounts, workers' own series, the rest)."""
        wanted, sums = set(labels.items()), dict[str, float]()
        for (sample, have), value in self.samples.items():
            if sample == name and wanted <= have:
                key = dict(have).get(label, "")
                sums[key] = sums.get(key, 0.0) + value
        return sums


@dataclass(frozen=True)
class View:
    """What one refresh shows of one server. Rates and latencies are over the interval since the last reading
    (``None`` when there is none to compare with); the rest is the server's now, or its totals since it started."""

    url: str
    state: str
    answered: bool = True  # its metrics were read
    episodes_open: int = 0
    seeds_per_s: float | None = None
    calls_per_s: float | None = None
    call_p50_s: float | None = None
    call_p99_s: float | None = None
    masked: dict[str, int] = field(default_factory=dict)  # verdicts masked since start, by failure_kind
    verdicts: int = 0  # verdicts given since start, masked or not
    instances: dict[str, int] = field(default_factory=dict)  # the pool now, by state
    seeds_waiting: int = 0
    stops: dict[str, int] = field(default_factory=dict)  # instances stopped since start, by reason


def read(client: httpx.Client, url: str) -> Reading:
    """``url``'s ``/readyz`` and ``/metrics`` now; a server that does not answer, or answers no metrics, is a
    reading that says so. ``client`` carries the token, if the server wants one, and the timeout."""
    base = url.rstrip("/")
    at = time.monotonic()
    try:
        ready = client.get(f"{base}/readyz")
        metrics = client.get(f"{base}/metrics")
    except httpx.HTTPError as error:
        return Reading(url, at, f"no answer: {type(error).__name__}")
    if metrics.status_code in (401, 403):
        return Reading(url, at, f"{_readiness(ready)}, /metrics refused ({metrics.status_code}: give --token)")
    if metrics.status_code != 200:
        return Reading(url, at, f"no answer: /metrics answered {metrics.status_code}")
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(metrics.text)
        for sample in family.samples
    }
    return Reading(url, at, _readiness(ready), samples)


def compare(before: Reading | None, now: Reading) -> View:
    """The view of ``now``, with the rates and latencies of the interval since ``before`` (the same server's)."""
    if not now.answered:
        return View(now.url, now.state, answered=False)
    masked = now.by("gymhost_episodes_ended_total", "failure_kind", outcome="masked")
    ended = now.by("gymhost_episodes_ended_total", "outcome")
    view = View(
        now.url,
        now.state,
        episodes_open=int(now.total("gymhost_episodes_open")),
        masked={kind: int(count) for kind, count in sorted(masked.items()) if count},
        verdicts=int(ended.get("rewarded", 0) + ended.get("masked", 0)),
        instances={state: int(count) for state, count in sorted(now.by("gymhost_instances", "state").items())},
        seeds_waiting=int(now.total("gymhost_seeds_waiting")),
        stops={
            reason: int(count) for reason, count in sorted(now.by("gymhost_instance_stops_total", "reason").items())
        },
    )
    if before is None or not before.answered or now.at <= before.at:
        return view
    seconds = now.at - before.at
    seeds = now.total("gymhost_sessions_started_total") - before.total("gymhost_sessions_started_total")
    if _restarted(before, now):  # its counters started again: no rate to give for this interval
        return view
    now_buckets, before_buckets = _call_buckets(now), _call_buckets(before)
    deltas = {le: count - before_buckets.get(le, 0.0) for le, count in now_buckets.items()}
    calls = deltas.get(float("inf"), 0.0)
    return View(
        **{
            **view.__dict__,
            "seeds_per_s": seeds / seconds,
            "calls_per_s": calls / seconds,
            "call_p50_s": _quantile(0.5, deltas),
            "call_p99_s": _quantile(0.99, deltas),
        }
    )


def _restarted(before: Reading, now: Reading) -> bool:
    """Whether any counter went down between two readings: the server (or a worker of it) started again, whatever
    it has served since; what then looks like a rate is not one."""
    return any(
        name.endswith(("_total", "_count", "_bucket")) and now.samples.get((name, labels), 0.0) < value
        for (name, labels), value in before.samples.items()
    )


def _readiness(answer: httpx.Response) -> str:
    if answer.status_code == 200:
        return "ready"
    try:
        reason = answer.json().get("reason")
    except ValueError:
        reason = None
    if reason == NOT_READY:
        return "draining"
    if isinstance(reason, dict):  # a gateway's: by mount
        reason = "; ".join(f"{mount}: {why}" for mount, why in reason.items())
    return f"not ready: {reason or answer.status_code}"


def _call_buckets(reading: Reading) -> dict[float, float]:
    """The tool calls' duration histogram, all routes that are tool calls summed: cumulative count by bound."""
    buckets: dict[float, float] = {}
    for (sample, labels), value in reading.samples.items():
        if sample != f"{_DURATION}_bucket":
            continue
        have = dict(labels)
        if have.get("http_route", "").rsplit("/", 1)[-1] in NOT_TOOL_CALLS:
            continue
        bound = float(have["le"])
        buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def _quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls in; the highest finite bound when
    it falls in the last one; ``None`` with no observation."""
    bounds: Iterable[float] = sorted(cumulative)
    total = cumulative.get(float("inf"), 0.0)
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
        lower, below = bound, count
    return lower
