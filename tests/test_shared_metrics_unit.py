"""A gateway's ``/metrics`` over its shared values folder (``_metrics._SharedMetrics``): what a confined server's
folder, which the code it runs may write, is read as."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict

from gymhost import _metrics as metrics
from gymhost._metrics import _DECLARED, _SharedMetrics, confined_metrics_folder, release_confined_metrics_folder

pytestmark = pytest.mark.unit

SESSIONS = _DECLARED["gymhost_sessions_started"].help
FORWARDS = _DECLARED["gymhost_forward_failures"].help


def write(path: Path, *entries: tuple[str, str, dict[str, str], str, float]) -> None:
    values = MmapedDict(str(path))
    for family, sample, labels, help_text, value in entries:
        values.write_value(json.dumps([family, sample, labels, help_text], sort_keys=True), value, 0.0)
    values.close()


def exposition(folder: Path) -> str:
    registry = CollectorRegistry()
    registry.register(_SharedMetrics(str(folder)))
    return generate_latest(registry).decode()


def test_a_confined_servers_samples_count_as_its_one_mounts(tmp_path: Path) -> None:
    """Sample by sample: its server's own series and its code's own families count, the latter as its mount's;
    what would count as another mount's, as one of gymhost's families of a gateway's process, or render under
    rewritten label names is left out, and the rest of the same file still counts."""
    runner = confined_metrics_folder(tmp_path, "/runner")
    write(
        runner / "counter_7.db",
        ("gymhost_sessions_started", "gymhost_sessions_started_total", {"mount": "/runner"}, SESSIONS, 2.0),
        ("gymhost_sessions_started", "gymhost_sessions_started_total", {"mount": "/other"}, SESSIONS, 5.0),
        ("library_requests", "library_requests_total", {}, "a library's own", 3.0),
        ("runner_odd", "runner_odd_total", {"a.b": "1"}, "rewritten label names", 1.0),
        ("runner_named", "runner_named_total", {"__name__": "x"}, "a reserved label name", 1.0),
        ("gymhost_forward_failures", "gymhost_forward_failures_total", {"reason": "gone", "target": "worker"},
         FORWARDS, 1e6),
    )  # fmt: skip
    text = exposition(tmp_path)
    assert 'gymhost_sessions_started_total{mount="/runner"} 2.0' in text, text
    assert 'library_requests_total{mount="/runner"} 3.0' in text, text
    assert "/other" not in text, text
    assert "runner_odd" not in text, text
    assert "runner_named" not in text, text
    assert "gymhost_forward_failures_total{" not in text, text
    release_confined_metrics_folder(runner)
    assert os.listdir(tmp_path) == [], "its values and its record are gone"


def test_a_folder_with_no_record_or_a_record_that_is_not_a_file_is_left_out(tmp_path: Path) -> None:
    """A confined server reads its own folder as a shared one; there the code it runs may make a folder, and a
    pipe where its record would be, which a read would wait on forever."""
    planted = tmp_path / "planted"
    planted.mkdir()
    os.mkfifo(tmp_path / "planted.mount")
    write(planted / "counter_9.db", ("planted", "planted_total", {"mount": "/"}, "planted", 1.0))
    (tmp_path / "unrecorded").mkdir()
    write(tmp_path / "unrecorded" / "counter_9.db", ("unrecorded", "unrecorded_total", {"mount": "/"}, "x", 1.0))
    read: list[str] = []
    reading = threading.Thread(target=lambda: read.append(exposition(tmp_path)), daemon=True)
    reading.start()
    reading.join(timeout=30)
    assert read, "reading the folder waited on the pipe"
    assert "planted" not in read[0], read[0]
    assert "unrecorded" not in read[0], read[0]


def test_a_family_of_hosted_code_declared_otherwise_by_a_later_server_is_left_out_there(tmp_path: Path) -> None:
    """prometheus_client's merge takes a family's type and help from the first file that names it: a second
    confined server's family of the same name and another type would be merged into the first's, or lost."""
    first, second = (confined_metrics_folder(tmp_path, mount) for mount in ("/a", "/b"))
    write(first / "counter_1.db", ("runner_calls", "runner_calls_total", {"mount": "/a"}, "calls", 1.0))
    write(second / "counter_1.db", ("runner_calls", "runner_calls_total", {"mount": "/b"}, "calls", 2.0))
    os.rename(second / "counter_1.db", second / "gauge_all_1.db")  # the same family, as a gauge
    text = exposition(tmp_path)
    kept = [line for line in text.splitlines() if line.startswith("runner_calls")]
    assert len(kept) == 1, text


def test_the_folder_of_a_confined_server_killed_before_it_removed_it_is_left_out_and_removed(tmp_path: Path) -> None:
    """A process mount killed (the OOM killer) leaves its folder; its gauges would count what was open then, for
    ever, beside the folder of the server started again in its place."""
    made_by_another = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from prometheus_client.mmap_dict import MmapedDict\n"
        "from gymhost._metrics import confined_metrics_folder\n"
        "values = MmapedDict(str(confined_metrics_folder(Path(sys.argv[1]), '/runner') / 'gauge_livesum_3.db'))\n"
        "values.write_value(json.dumps(['runner_open', 'runner_open', {'mount': '/runner'}, 'open'], sort_keys=True),"
        " 7.0, 0.0)\n"
    )  # the process mount: makes its folder and writes, then is gone without removing it
    subprocess.run([sys.executable, "-c", made_by_another, str(tmp_path)], check=True)
    assert len(os.listdir(tmp_path)) == 2, "its folder and its record"
    kept = confined_metrics_folder(tmp_path, "/runner")  # this process's, alive
    write(kept / "gauge_livesum_4.db", ("runner_open", "runner_open", {"mount": "/runner"}, "open", 1.0))
    text = exposition(tmp_path)
    assert 'runner_open{mount="/runner"} 1.0' in text, text
    assert sorted(os.listdir(tmp_path)) == sorted([kept.name, kept.name + ".mount"])


def test_what_a_confined_server_writes_never_changes_the_gateways_own_series(tmp_path: Path) -> None:
    """The gateway's own processes' families (a process mount's own code's too) keep their type, whatever a
    confined server declares; a family of no mount from a confined server would count as the gateway's own; a
    ``pid`` label in a gauge would give two samples one name (the merge gives each its file's); and a sample both
    with its mount and with none would be one after the relabel, the second overwriting the first."""
    write(tmp_path / "gauge_livesum_1.db", ("lib_inflight", "lib_inflight", {"mount": "/venv"}, "in flight", 3.0))
    runner = confined_metrics_folder(tmp_path, "/runner")
    write(runner / "gauge_all_7.db", ("lib_inflight", "lib_inflight", {"mount": "/runner"}, "changed", 1.0))
    write(
        runner / "counter_7.db",
        ("gymhost_accept_errors", "gymhost_accept_errors_total", {"reason": "descriptors"},
         _DECLARED["gymhost_accept_errors"].help, 1e9),
        ("calls", "calls_total", {"mount": "/runner"}, "calls", 5.0),
        ("calls", "calls_total", {}, "calls", 3.0),
    )  # fmt: skip
    write(runner / "gauge_all_8.db", ("runner_gauge", "runner_gauge", {"pid": "1"}, "a gauge", 1.0))
    text = exposition(tmp_path)
    assert 'lib_inflight{mount="/venv"} 3.0' in text, text
    assert "pid=" not in text, text
    assert "gymhost_accept_errors_total{" not in text, text
    assert 'calls_total{mount="/runner"} 5.0' in text, text


def test_the_gateways_own_values_are_read_whatever_their_size(tmp_path: Path) -> None:
    """A confined server's files are read up to a bound; gymhost's own grow with their series (a gateway of many
    mounts and routes writes megabytes) and are read whole."""
    values = MmapedDict(str(tmp_path / "counter_1.db"))
    for route in range(40_000):
        key = ["gateway_requests", "gateway_requests_total", {"mount": f"/m{route}"}, "its requests, by mount"]
        values.write_value(json.dumps(key, sort_keys=True), 1.0, 0.0)
    values.close()
    assert os.path.getsize(tmp_path / "counter_1.db") > 4 << 20
    assert 'mount="/m39999"' in exposition(tmp_path)


def ordered(folder: Path, mount: str, last: str) -> Path:
    """``confined_metrics_folder``'s, renamed to sort by ``last`` among those of this process (as read)."""
    made = confined_metrics_folder(folder, mount)
    renamed = made.with_name(made.name.rpartition("-")[0] + "-" + last)
    made.rename(renamed)
    Path(f"{made}.mount").rename(f"{renamed}.mount")
    return renamed


def test_no_two_families_render_one_name_and_a_folder_left_out_claims_none(tmp_path: Path) -> None:
    """A strict parser refuses an exposition with a sample name twice, and Prometheus counts the second as a
    duplicate; and a folder whose values do not merge, left out, holds no name against the folders after it."""
    first, second, third = (ordered(tmp_path, f"/{name}", name) for name in "abc")
    write(first / "counter_1.db", ("x", "x_total", {}, "x", 1.0), ("y", "z_total", {}, "not y's", 1.0))
    write(
        second / "histogram_1.db",
        ("requests", "requests_bucket", {"le": "not a number"}, "requests", 1.0),
        ("requests", "requests_count", {}, "requests", 1.0),
    )
    write(third / "gauge_livesum_1.db", ("x_total", "x_total", {}, "x as a gauge", 2.0))
    write(third / "counter_1.db", ("requests", "requests_total", {}, "requests", 5.0))
    text = exposition(tmp_path)
    assert [line for line in text.splitlines() if line.startswith("x_total")] == ['x_total{mount="/a"} 1.0'], text
    assert "z_total" not in text, text
    assert 'requests_total{mount="/c"} 5.0' in text, text


def test_a_confined_servers_own_folder_is_read_past_what_does_not_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a confined server the code it runs writes in the server's own values folder too: a file there that does
    not merge is left out, where it made the server's /metrics a 500."""
    monkeypatch.setattr(metrics, "_own_folder_hosted", True)  # as own_folder_is_hosted() says in one
    write(tmp_path / "counter_2.db", ("gymhost_sessions_started", "gymhost_sessions_started_total",
                                      {"mount": "/runner"}, SESSIONS, 1.0))  # fmt: skip
    values = MmapedDict(str(tmp_path / "counter_3.db"))
    values.write_value("not json", 1.0, 0.0)
    values.close()
    assert 'gymhost_sessions_started_total{mount="/runner"} 1.0' in exposition(tmp_path)
