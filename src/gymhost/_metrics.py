"""Prometheus metrics: what gymhost exports, in one place, and how ``/metrics`` renders them.

Names follow OpenTelemetry's HTTP conventions where one exists (``http.server.request.duration`` is
``http_server_request_duration_seconds`` in Prometheus, with OTel's attribute names as labels), and carry the
``gymhost_`` prefix otherwise. Every series has a ``mount`` label (``/`` for an app served alone, ``/gridsim`` under a
gateway); routes are templates and tools are the card's, so the number of series stays bounded whatever the
traffic. The metrics live in prometheus_client's default registry, with the process's own (CPU, memory, file
descriptors); with ``PROMETHEUS_MULTIPROC_DIR`` set before gymhost is imported, prometheus_client's multiprocess mode
aggregates them across worker processes.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from ._scratch import maker_gone, maker_stamp, remove

__all__ = [
    "CONTENT_TYPE",
    "HTTP_ACTIVE_REQUESTS",
    "HTTP_REQUEST_DURATION",
    "METRICS_FOLDER_ENV_VAR",
    "EpisodeMetrics",
    "accept_failed",
    "exported_names",
    "handed_off",
    "listen_overflowed",
    "render",
    "share_metrics",
    "shared_metrics_folder",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
logger = logging.getLogger("gymhost")

METRICS_FOLDER_ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: where processes keep shared values
ROOT = "/"
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SLOW = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

HTTP_REQUEST_DURATION = Histogram(
    "http_server_request_duration_seconds",
    "Duration of HTTP server requests (OpenTelemetry http.server.request.duration).",
    ["mount", "http_request_method", "http_route", "http_response_status_code"],
    buckets=_FAST,
)
HTTP_ACTIVE_REQUESTS = Gauge(
    "http_server_active_requests",
    "HTTP server requests in flight (OpenTelemetry http.server.active_requests).",
    ["mount", "http_request_method"],
    multiprocess_mode="livesum",
)
_EPISODES_OPEN = Gauge(
    "gymhost_episodes_open", "Episodes seeded and not yet ended.", ["mount"], multiprocess_mode="livesum"
)
_EPISODES_ENDED = Counter(
    "gymhost_episodes_ended",
    "Episodes ended: rewarded (a verdict the grader gave), masked (the infrastructure failed; failure_kind says how),"
    " or closed without a verdict.",
    ["mount", "outcome", "failure_kind"],
)
_REWARD = Histogram(
    "gymhost_reward",
    "Rewards of the episodes verified with a genuine (unmasked) verdict.",
    ["mount"],
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0),
)
_VERDICTS_REFUSED = Counter(
    "gymhost_masked_verdicts_refused",
    "Masked verdicts answered as an HTTP error instead of a 200 (--masked-verdicts refuse), so that a client that "
    "never reads mask_sample fails the rollout instead of training on its 0.0; by failure_kind.",
    ["mount", "failure_kind"],
)
LOST_WHY = ("owner_gone", "another_secret")  # why a request of an episode is answered as lost
STOP_REASONS = ("memory", "processes", "cpu_time", "file_size", "exited")  # why an instance ended unasked
_LOST_REQUESTS = Counter(
    "gymhost_lost_session_requests",
    "Requests of an episode this process cannot serve, answered as lost (410 session_lost, or a masked verify): "
    "its owner is gone (owner_gone: restarted, or unreachable) or it was signed with another secret "
    "(another_secret: a restart that kept no secret, or a replica with another).",
    ["mount", "why"],
)
_SEED_WAIT = Histogram(
    "gymhost_seed_wait_seconds", "How long a seed waited for an environment instance.", ["mount"], buckets=_SLOW
)
_TOOL_CALL = Histogram(
    "gymhost_tool_call_duration_seconds", "Duration of bridged tool calls, by tool.", ["mount", "tool"], buckets=_FAST
)
_INSTANCES = Gauge(
    "gymhost_instances", "Environment instances by state.", ["mount", "state"], multiprocess_mode="livesum"
)
_CONFINEMENT = Gauge(
    "gymhost_instance_confinement",
    "1 for how the environment instances' code is confined: namespaces, landlock, limits, none, or elsewhere (someone "
    "else runs them).",
    ["mount", "level"],
    multiprocess_mode="max",
)
_INSTANCE_STOPS = Counter(
    "gymhost_instance_stops",
    "Environment instances that ended without the pool asking: by the limit they reached (memory, processes, "
    "cpu_time, file_size), or exited.",
    ["mount", "reason"],
)
_SEEDS_WAITING = Gauge(
    "gymhost_seeds_waiting", "Seeds waiting for an environment instance.", ["mount"], multiprocess_mode="livesum"
)
_SESSIONS_STARTED = Counter(
    "gymhost_sessions_started", "Sessions seeded (POST /seed_session answered 2xx), on any server.", ["mount"]
)
# The process's, not a mount's: no mount label, so every mount's /metrics shows them.
_ACCEPT_ERRORS = Counter(
    "gymhost_accept_errors",
    "Times the server could not accept connections, by what it ran out of (descriptors, memory); the connections "
    "waited in the kernel's queue meanwhile.",
    ["reason"],
)
_LISTEN_OVERFLOWS = Counter(
    "gymhost_listen_overflows",
    "Connections the kernel refused because a listen queue was full (ListenOverflows of /proc/net/netstat: this "
    "network namespace's, every listening socket's); clients retry them.",
    ["field"],  # a label, as every gymhost metric has: one made at import is left out of multiprocess mode
)
_FORWARD_FAILURES = Counter(
    "gymhost_forward_failures",
    "Requests that could not be forwarded to the process owning their session, by its kind (worker, replica) and "
    "why: gone (answered as a lost session) or busy (answered 503, Retry-After).",
    ["target", "reason"],
)
_HANDOFFS = Counter(
    "gymhost_handoffs",
    "Connections a worker handed to the sibling owning their session (sent), or could not and forwarded their "
    "request instead (owner_busy, owner_gone); dropped: handed over to a worker out of descriptors, and lost.",
    ["outcome"],
)
_OURS = (HTTP_REQUEST_DURATION, HTTP_ACTIVE_REQUESTS, _EPISODES_OPEN, _EPISODES_ENDED, _REWARD, _VERDICTS_REFUSED,
         _LOST_REQUESTS, _SEED_WAIT, _TOOL_CALL, _INSTANCES, _CONFINEMENT, _INSTANCE_STOPS, _SEEDS_WAITING,
         _SESSIONS_STARTED, _ACCEPT_ERRORS,
         _LISTEN_OVERFLOWS, _FORWARD_FAILURES, _HANDOFFS)  # fmt: skip


def accept_failed(reason: str) -> None:
    _ACCEPT_ERRORS.labels(reason).inc()


def listen_overflowed(count: int) -> None:
    _LISTEN_OVERFLOWS.labels("ListenOverflows").inc(count)


def forward_failed(target: str, reason: str) -> None:
    _FORWARD_FAILURES.labels(target, reason).inc()


def handed_off(outcome: str) -> None:
    _HANDOFFS.labels(outcome).inc()


class EpisodeMetrics:
    """One app's episode metrics. Its mount is known once the app's lifespan starts (a gateway says where it
    mounted it), so the series are bound then, each at 0 from the start. None is made before it is bound or used:
    a process serving one mount writes no series of another (a gateway reads a confined server's as of its mount
    alone)."""

    def __init__(self) -> None:
        self.mount = ROOT
        self._made: _Series | None = None

    def bind(self, mount: str) -> None:
        self.mount = mount or ROOT
        self._made = _Series(self.mount)

    @property
    def _series(self) -> _Series:
        """The mount's series; made now if used before the app's lifespan bound them (a pool on its own: the root)."""
        if self._made is None:
            self._made = _Series(self.mount)
        return self._made

    def session_started(self) -> None:
        self._series.sessions.inc()

    def seed_waited(self, seconds: float) -> None:
        self._series.seed_wait.observe(seconds)

    def tool_called(self, tool: str, seconds: float) -> None:
        tools = self._series.tools
        child = tools.get(tool)
        if child is None:
            child = tools[tool] = _TOOL_CALL.labels(self.mount, tool)
        child.observe(seconds)

    def ended(self, outcome: str, failure_kind: str | None = None, reward: float | None = None) -> None:
        _EPISODES_ENDED.labels(self.mount, outcome, failure_kind or "").inc()
        if outcome == "rewarded" and reward is not None:
            self._series.reward.observe(reward)

    def request_lost(self, why: str) -> None:
        _LOST_REQUESTS.labels(self.mount, why).inc()

    def instance_stopped(self, reason: str) -> None:
        _INSTANCE_STOPS.labels(self.mount, reason).inc()

    def verdict_refused(self, failure_kind: str) -> None:
        _VERDICTS_REFUSED.labels(self.mount, failure_kind).inc()

    def gauges(
        self,
        *,
        open_episodes: int,
        instances: dict[str, int] | None = None,
        waiting: int = 0,
        confinement: str | None = None,
    ) -> None:
        series = self._series
        series.open.set(open_episodes)
        series.waiting.set(waiting)
        for state, count in (instances or {}).items():
            _INSTANCES.labels(self.mount, state).set(count)
        if instances is not None and not series.stops_counted:  # a pool: its stops at 0 from the start, as above
            series.stops_counted = True
            for reason in STOP_REASONS:
                _INSTANCE_STOPS.labels(self.mount, reason)
        if confinement is not None:
            _CONFINEMENT.labels(self.mount, confinement).set(1)


class _Series:
    """One mount's series an app uses on every episode, looked up once."""

    def __init__(self, mount: str) -> None:
        self.open = _EPISODES_OPEN.labels(mount)
        self.reward = _REWARD.labels(mount)
        self.seed_wait = _SEED_WAIT.labels(mount)
        self.waiting = _SEEDS_WAITING.labels(mount)
        self.sessions = _SESSIONS_STARTED.labels(mount)
        self.tools: dict[str, Any] = {}
        for why in LOST_WHY:  # at 0 from the start: an alert's increase() sees the first burst of losses
            _LOST_REQUESTS.labels(mount, why)
        self.stops_counted = False


def share_metrics(folder: Path) -> None:
    """From now on, this process and the processes it starts keep their metrics in ``folder``, and ``render``
    adds them all up (prometheus_client's multiprocess mode): workers, and a gateway's process mounts. Call it
    before any metric has a value."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[METRICS_FOLDER_ENV_VAR] = str(folder)
    # prometheus_client chose how to keep values when it was imported (maybe already, by this module); gymhost's
    # metrics all have labels, so none has a value yet, and every one made from now on goes to the folder.
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def shared_metrics_folder() -> Path | None:
    """The folder this process keeps its metrics in with others' (``share_metrics``), if any: a confined process
    mount is handed a folder inside it (``confined_metrics_folder``)."""
    folder = os.environ.get(METRICS_FOLDER_ENV_VAR)
    return Path(folder) if folder else None


def own_folder_is_hosted() -> None:
    """In a confined server: the code it runs may write in its own values folder too, which its ``/metrics`` then
    reads through copies, leaving out what does not merge (a gateway's and workers' own folders are gymhost's)."""
    global _own_folder_hosted
    _own_folder_hosted = True


_own_folder_hosted = False


def confined_metrics_folder(shared: Path, mount: str) -> Path:
    """A folder of its own in ``shared`` for a confined server of ``mount`` (a gateway's process mount) to keep its
    values in, and, beside it where its sandbox cannot write, the record of that mount: what the code it runs
    writes there is read as that mount's, never as another's (``_SharedMetrics``). Removed with
    ``release_confined_metrics_folder``."""
    made = Path(tempfile.mkdtemp(prefix=f"{_CONFINED}{maker_stamp()}-", dir=shared))
    _mount_record(str(made)).write_text(mount or ROOT, encoding="utf-8")
    return made


def release_confined_metrics_folder(made: Path) -> None:
    """``made``'s values and record gone: its server's process is, and its sums leave the gateway's with it."""
    remove(made)
    _mount_record(str(made)).unlink(missing_ok=True)


def _maker_gone(folder: str) -> bool:
    """Whether the process that made a confined server's ``folder`` (the one that ran it: a gateway's process
    mount) is gone without removing it."""
    name = os.path.basename(folder)
    return name.startswith(_CONFINED) and maker_gone(name[len(_CONFINED) :].rpartition("-")[0])


def _mount_record(folder: str) -> Path:
    return Path(folder + _MOUNT_RECORD)


def _recorded_mount(folder: str) -> str | None:
    """The mount recorded beside ``folder``; None if there is no record (nor a regular file there: a confined
    server reads its own folder as a shared one, where the code it runs may have made a pipe of that name)."""
    with _regular_file(str(_mount_record(folder))) as file:
        try:
            return file.read(_MAX_MOUNT_BYTES).decode("utf-8") if file is not None else None
        except (OSError, UnicodeDecodeError):
            return None


_CONFINED = "confined-"  # a confined server's folder: confined-<its maker's stamp>-<random>
_MOUNT_RECORD = ".mount"  # beside a confined server's folder, in the shared one: the mount its values are of
_MAX_MOUNT_BYTES = 4096


class _SharedMetrics:
    """prometheus_client's ``MultiProcessCollector``, over the shared folder and the folders below it: a confined
    server writes its values in a folder of its own there, the only one its sandbox lets it write. So does the code
    it runs for the model (``code_gen``'s verify), which may write anything there, swap it as it is read, or make it
    a pipe. So a folder below is read through copies (``_copied``: regular files, never through a link, of a bounded
    size), after gymhost's own processes' files, and as the one mount its record says (``confined_metrics_folder``):
    its samples that would pass for another mount's, change gymhost's families or another folder's, or render
    under a name already taken are left out (``_Reading``, ``_Names``), and so is a folder whose maker is gone,
    that has no record, holds too many samples, or whose values do not merge; each said in the log, a bounded number
    of times a folder. Everything is merged once at the end."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def collect(self) -> Iterable[Metric]:
        with tempfile.TemporaryDirectory(prefix="gymhost-metrics-read-") as copies:
            own = sorted(_value_files(self.folder, depth=1))  # gymhost's processes'; in a confined server's own
            if _own_folder_hosted:  # read through copies, those that do not merge left out
                copied, merged = _mergeable([c for path in own if (c := _copied(path, f"{copies}/own")) is not None])
            else:  # gymhost's processes' alone, as they are
                copied, own_merged = own, _merged(own)
                assert own_merged is not None, "gymhost's own values always merge"
                merged = own_merged
            below_all = _folders_below(self.folder)
            if not below_all:  # no confined server's: gymhost's own, merged once
                return merged
            names, folders = _Names.of(copied), []
            for number, below in enumerate(below_all):
                if _maker_gone(below):  # killed (the OOM killer): its gauges of what was open would stay
                    release_confined_metrics_folder(Path(below))
                    continue
                mount = _recorded_mount(below)
                if mount is None:
                    _left_out(below, "no record says which mount its server serves")
                    continue
                reading, files, places = _Reading(below, mount, names), [], dict[str, int]()
                for path in sorted(_value_files(below, depth=2))[:_MAX_FILES_A_FOLDER]:
                    place = places.setdefault(os.path.dirname(path), len(places))  # names are one folder's each
                    copy = _copied(path, f"{copies}/{number}-{place}", _MAX_USED_BYTES)
                    if copy is not None and reading.keep(copy, path):
                        files.append(copy)
                if reading.entries > _MAX_ENTRIES_A_FOLDER:
                    _left_out(below, f"its files hold more than {_MAX_ENTRIES_A_FOLDER} samples")
                elif _merged(files) is None:  # alone: its names were checked against the others' as it was read
                    _left_out(below, "its values do not merge")
                else:
                    names.take(reading.staged)
                    folders.append(files)
            everything = _merged([*copied, *(path for files in folders for path in files)])
            if everything is not None:
                return everything
            for files in folders:  # not expected: each folder merges alone, of names no other holds
                tried = _merged([*copied, *files])
                if tried is not None:
                    copied, merged = [*copied, *files], tried
        return merged


_MAX_FILES_A_FOLDER = 256  # a confined server's values files: one a metric type and process (a few dozen)
_MAX_ENTRIES_A_FOLDER = 20_000  # its samples (an honest server's: a few hundred); a scrape reads them all
_MAX_USED_BYTES = 4 * 1024 * 1024  # a values file's entries (a few thousand series); past this it is not read
_LEFT_OUT_SAID: set[str] = set()  # what was left out, said once each
_SAID: collections.Counter[str] = collections.Counter()  # by confined server's folder
_SAID_AMONG = 20


def _merged(files: list[str]) -> list[Metric] | None:
    """``files`` merged and rendered, or None where they do not."""
    from prometheus_client import multiprocess

    try:
        merged = list(multiprocess.MultiProcessCollector.merge(files, accumulate=True))  # type: ignore[no-untyped-call]
        registry = CollectorRegistry()
        registry.register(_Collected(merged))
        generate_latest(registry)
    except Exception:
        return None
    return merged


def _mergeable(files: list[str]) -> tuple[list[str], list[Metric]]:
    """``files``, those that do not merge with the ones before them left out (logged), and their merge: gymhost's
    processes' always merge, but in a confined server's own folder the code it runs writes too."""
    merged = _merged(files)
    if merged is not None:
        return files, merged
    kept: list[str] = []
    for path in files:
        tried = _merged([*kept, path])
        if tried is None:
            _left_out(path, "it holds no values gymhost can read")
        else:
            kept, merged = [*kept, path], tried
    return kept, merged or []


def _entries(path: str) -> Iterator[tuple[str, float, float]]:
    """The values file's entries: key, value, timestamp."""
    from prometheus_client.mmap_dict import MmapedDict

    for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
        yield key, value, timestamp


def _kind_of(path: str) -> str:
    """A values file's type, as its name says: ``counter``, ``histogram``, ``gauge_livesum``..."""
    kind, _, rest = os.path.basename(path).partition("_")
    return kind + "_" + rest.partition("_")[0] if kind == "gauge" else kind


class _Names:
    """What an exposition holds so far: each family not gymhost's with its type and help, and each sample name
    with its family (gymhost's declared ones included). A confined server's families are held to them, so that
    none changes another's type or help, nor renders a sample under another's name (which a strict parser refuses,
    and Prometheus counts as a duplicate); a folder's own are taken in once the folder is kept."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str]] = {}
        self.samples = {sample: family for family, declared in _DECLARED.items() for sample in declared.samples}

    @classmethod
    def of(cls, files: list[str]) -> _Names:
        """gymhost's and those of the gateway's own ``files`` (a process mount's own code's, say)."""
        names = cls()
        for path in files:
            for key, _, _ in _entries(path):
                with contextlib.suppress(ValueError, TypeError):  # merged already: read as the merge reads them
                    family, sample, _, help_text = json.loads(key)
                    if family not in _DECLARED:
                        names.families.setdefault(family, (_kind_of(path), help_text))
                        names.samples.setdefault(sample, family)
        return names

    def conflict(self, staged: _Names, kind: str, family: str, sample: str, help_text: str) -> str | None:
        """Why ``family``'s ``sample`` cannot be added to these and ``staged``, or None (then it is, to ``staged``)."""
        for names in (self, staged):
            if names.families.get(family, (kind, help_text)) != (kind, help_text):
                return f"its {family} is declared otherwise than where it was read before"
            if names.samples.get(sample, family) != family:
                return f"its {sample} is a sample of another family, {names.samples[sample]}"
        staged.families[family], staged.samples[sample] = (kind, help_text), family
        return None

    def take(self, staged: _Names) -> None:
        self.families.update(staged.families)
        self.samples.update(staged.samples)


class _Reading:
    """What of a values file from the folder of a confined server of ``mount`` is counted. A sample is left out if
    it would pass for, or change, one of gymhost's families: one of gymhost's named otherwise than gymhost declares
    it (another type or gauge mode, its file's name says; another help text; a sample name or label names not its),
    or any other family or sample under gymhost's prefixes, or under a name the exposition would rewrite
    (``generate_latest`` escapes what a classic name may not hold, and writes a counter's family with ``_total``:
    either could render as one of gymhost's). The merge takes a family's help and type from the first file that
    names it and a gauge's mode from the last, so such a sample would relabel the family, gymhost's own files' too.
    It is also left out if it is of another mount (each would count as that mount's), or one of gymhost's families
    of a whole process (of no mount: it would count as the gateway's own), or has label names the exposition would
    rewrite, or a ``pid`` label in a gauge (the merge gives a gauge's samples their file's), or a sample name its
    family's type does not write, or (``names``: those of the gateway's own files and of the folders kept before)
    declares a family not gymhost's otherwise than they do, or renders under another family's sample name. A
    sample of hosted code's own family with no mount is counted as its server's mount's (each mount's ``/metrics``
    shows the samples of none), unless the same sample is there with its mount too."""

    def __init__(self, folder: str, mount: str, names: _Names) -> None:
        self.folder, self.mount, self.names = folder, mount, names
        self.staged = _Names()  # its own families, until its folder is kept
        self.entries = 0

    def keep(self, copy: str, path: str) -> bool:
        """Whether the copy of the values file at ``path`` holds values, rewritten with what of them is counted; what
        is not, logged."""
        from prometheus_client.mmap_dict import MmapedDict

        kind, kept, why, relabelled = _kind_of(copy), dict[str, tuple[float, float]](), None, False
        try:
            entries = list(_entries(copy))
        except Exception:  # not what prometheus_client writes, in any of the ways reading that fails
            _left_out(path, "it holds no values gymhost can read", among=self.folder)
            return False
        self.entries += len(entries)
        if self.entries > _MAX_ENTRIES_A_FOLDER:
            return False  # its folder is left out whole
        for key, value, timestamp in entries:
            try:
                family, sample, labels, help_text = json.loads(key)
                refused = self._refusal(kind, family, sample, labels, help_text)
                if refused is None and "mount" not in labels and family not in _DECLARED:  # its own, of no mount
                    key = json.dumps([family, sample, {**labels, "mount": self.mount}, help_text], sort_keys=True)
                    relabelled = True
            except (ValueError, TypeError, AttributeError):
                refused = "its entries are not what prometheus_client writes"
            if refused is None and key in kept:
                refused = f"its {family} has a sample both with its mount and with none"
            if refused is None:
                kept[key] = (value, timestamp)
            else:
                why = why or refused
        if why is not None:
            _left_out(f"samples of {path}", why, among=self.folder)
        if why is not None or relabelled:
            os.remove(copy)
            values = MmapedDict(copy)  # type: ignore[no-untyped-call]
            try:
                for key, (value, timestamp) in kept.items():
                    values.write_value(key, value, timestamp)  # type: ignore[no-untyped-call]
            finally:
                values.close()  # type: ignore[no-untyped-call]
        return True

    def _refusal(self, kind: str, family: Any, sample: Any, labels: Any, help_text: Any) -> str | None:
        if not all(isinstance(part, str) for part in (family, sample, help_text, *labels, *labels.values())):
            return "its entries are not what prometheus_client writes"
        if not all(_CLASSIC_LABEL.match(name) and not name.startswith("__") for name in labels):
            return f"its {family} has label names the exposition would rewrite"
        if labels.get("mount", self.mount) != self.mount:
            return f"its {family} is not of {self.mount}, the one mount its server serves"
        declared = _DECLARED.get(family)
        if declared is None:
            names = (family, sample, family + "_total")
            if not all(_CLASSIC_NAME.match(name) and not name.startswith(_OURS_PREFIXES) for name in names):
                return f"its {family} would pass for, or relabel, one of gymhost's metrics"
            suffixes = _SUFFIXES.get(kind.partition("_")[0])
            if suffixes is None or not any(sample == family + suffix for suffix in suffixes):
                return f"its {family}'s sample {sample} is none a {kind} of that name writes"
            if kind.startswith("gauge") and "pid" in labels:
                return f"its {family} has a pid label, which the merge gives a gauge's samples"
            return self.names.conflict(self.staged, kind, family, sample, help_text)
        elif (kind, help_text, frozenset(labels)) != (declared.kind, declared.help, declared.samples.get(sample)):
            return f"its {family} would pass for, or relabel, one of gymhost's metrics"
        elif "mount" not in labels:
            return f"its {family} is of no mount, as the gateway's own process's is"
        return None


class _Declared(NamedTuple):
    """One of gymhost's families as a values file names it: its file's type (``counter``, ``gauge_livesum``...),
    its help text, and its samples' names, each with the label names its values are written with."""

    kind: str
    help: str
    samples: dict[str, frozenset[str]]


def _declarations() -> dict[str, _Declared]:
    declared = {}
    for metric in _OURS:
        labels = frozenset(metric._labelnames)
        for family in metric.describe():
            mode = getattr(metric, "_multiprocess_mode", None)  # a gauge's (prometheus_client's name for it)
            kind = f"gauge_{mode}" if family.type == "gauge" else family.type
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            samples = {family.name + suffix: labels | ({"le"} if suffix == "_bucket" else set()) for suffix in suffixes}
            declared[family.name] = _Declared(kind, family.documentation, samples)
    return declared


_DECLARED = _declarations()
_OURS_PREFIXES = ("gymhost_", "http_server_")  # every family of gymhost's begins so
_CLASSIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")  # what the exposition writes as it is
_CLASSIC_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The samples prometheus_client's multiprocess mode writes of a family, by type (no info, enum or _created there).
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}


class _Collected:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def _copied(path: str, folder: str, at_most: int | None = None) -> str | None:
    """A copy of the values file at ``path`` in ``folder``, under its own name, its entries within ``at_most`` bytes
    (a confined server's: gymhost's own grow with their series); None if it is not one (``_regular_file``)."""
    with _regular_file(path) as file:
        if file is None:
            return None
        try:
            header = file.read(8)
            used = int.from_bytes(header[:4], "little", signed=True) if len(header) == 8 else -1
            if used < 8 or (at_most is not None and used > at_most):
                _left_out(path, f"its header says {used} bytes")
                return None
            data = header + file.read(used - 8)
        except OSError:
            return None
    os.makedirs(folder, exist_ok=True)
    copy = os.path.join(folder, os.path.basename(path))
    with open(copy, "wb") as written:
        written.write(data)
    return copy


@contextlib.contextmanager
def _regular_file(path: str) -> Iterator[BinaryIO | None]:
    """The regular file at ``path``, opened without following a link nor waiting on a pipe; None if it is not one
    (its reads may still fail: ``OSError``)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        regular = stat.S_ISREG(os.fstat(descriptor).st_mode)
    except OSError:
        regular = False
    try:
        if not regular:
            yield None
            return
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            yield file
    finally:
        os.close(descriptor)


def _left_out(what: str, why: str, among: str = "") -> None:
    """Said once for each ``what``, and at most ``_SAID_AMONG`` times ``among`` a confined server's folder: one
    whose code names file after file would otherwise use up what is said for the others."""
    if what in _LEFT_OUT_SAID or len(_LEFT_OUT_SAID) >= 1000 or _SAID[among] >= _SAID_AMONG:
        return
    _LEFT_OUT_SAID.add(what)
    _SAID[among] += bool(among)
    logger.warning("metrics: left out %s: %s", what, why)


def _folders_below(folder: str) -> list[str]:
    try:
        return sorted(entry.path for entry in os.scandir(folder) if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _value_files(folder: str, depth: int) -> Iterator[str]:
    """The ``*.db`` files in ``folder`` and its folders, ``depth`` deep: regular files only, never through a link
    (a confined server writes in a folder below; what it plants there is not followed out of it, nor read if it
    is a pipe)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and depth > 1:
            yield from _value_files(entry.path, depth - 1)
        elif entry.name.endswith(".db") and entry.is_file(follow_symlinks=False):
            yield entry.path


def render(mount: str | None = None) -> bytes:
    """The exposition text: every series, or (``mount``) one app's and the process's own."""
    registry: Any = REGISTRY
    folder = os.environ.get(METRICS_FOLDER_ENV_VAR)
    if folder:
        registry = CollectorRegistry()
        registry.register(_SharedMetrics(folder))
    if mount is not None:
        registry = _OneMount(registry, mount or ROOT)
    output: bytes = generate_latest(registry)
    return output


def exported_names() -> set[str]:
    """The sample names gymhost's own metrics export (a counter ``x`` as ``x_total``; a histogram as ``_bucket``,
    ``_sum`` and ``_count``): what a dashboard may query."""
    return {sample for declared in _DECLARED.values() for sample in declared.samples}


class _OneMount:
    """A registry's families with only the samples of one mount (and those with no mount: the process's)."""

    def __init__(self, registry: Any, mount: str) -> None:
        self.registry, self.mount = registry, mount

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            kept = [sample for sample in family.samples if sample.labels.get("mount", self.mount) == self.mount]
            if kept or not family.samples:
                family.samples = kept
                yield family
