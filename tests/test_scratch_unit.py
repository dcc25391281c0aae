"""gymhost's folders under the temporary directory: each named for the process that made it, and removed by whoever
finds it once that process is gone, never while it lives (a reused pid included), nor anyone else's."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gymhost._scratch import remove, remove_orphaned, scratch_folder

pytestmark = pytest.mark.unit

MAKE = "from gymhost._scratch import scratch_folder; print(scratch_folder({kind!r}), flush=True)"


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory, for this process and the ones it starts."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def made_by_a_process_that(ends: str, kind: str = "instances") -> Path:
    """A folder made by another process, which then exits without removing it, or is killed."""
    command = [sys.executable, "-c", MAKE.format(kind=kind)]
    if ends == "killed":
        command[-1] += "; import time; time.sleep(60)"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    folder = Path(process.stdout.readline().strip())
    if ends == "killed":
        process.send_signal(signal.SIGKILL)
    process.wait(30)
    assert folder.is_dir()
    return folder


def test_a_folder_is_private_and_named_for_its_maker(temporary: Path) -> None:
    folder = scratch_folder("workers")
    assert folder.parent == temporary
    assert folder.name.startswith(f"gymhost-workers-{os.getpid()}-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    remove(folder)
    assert not folder.exists()


def test_an_unknown_kind_is_refused(temporary: Path) -> None:
    with pytest.raises(ValueError, match="no kind of gymhost folder"):
        scratch_folder("sockets")  # type: ignore[arg-type]


@pytest.mark.parametrize("ends", ["exited", "killed"])
@pytest.mark.parametrize("kind", ["workers", "metrics", "mount", "instances", "agent-env"])
def test_a_dead_makers_folder_goes_when_the_next_folder_is_made(temporary: Path, ends: str, kind: str) -> None:
    left = made_by_a_process_that(ends, kind)
    (left / "worker-0.forwards").write_text("")  # whatever it held
    mine = scratch_folder("instances")
    assert not left.exists()
    assert mine.is_dir()


def test_a_living_makers_folder_stays(temporary: Path) -> None:
    command = [sys.executable, "-c", MAKE.format(kind="mount") + "; import sys; sys.stdin.read()"]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        theirs = Path(process.stdout.readline().strip())
        mine = scratch_folder("mount")
        assert remove_orphaned() == []
        assert theirs.is_dir()
        assert mine.is_dir()
        process.stdin.close()  # it ends without removing its folder
    assert remove_orphaned() == [theirs]
    assert mine.is_dir()


def test_a_reused_pid_is_not_the_maker(temporary: Path) -> None:
    """The same pid with another start time is another process: the folder's maker is gone."""
    mine = scratch_folder("instances")
    _, _, pid, start, namespace, rest = mine.name.split("-", 5)
    earlier = temporary / f"gymhost-instances-{pid}-{int(start) - 1}-{namespace}-{rest}"
    earlier.mkdir()
    assert remove_orphaned() == [earlier]
    assert mine.is_dir()


def test_what_cannot_be_told_dead_from_here_is_left_alone(temporary: Path) -> None:
    """Another PID namespace's (its pids are not ours), another shape (an older gymhost's), a file, a link."""
    dead = made_by_a_process_that("exited")
    _, _, pid, start, namespace, rest = dead.name.split("-", 5)
    others = [
        temporary / f"gymhost-instances-{pid}-{start}-{int(namespace) + 1}-{rest}",
        temporary / "gymhost-instances-k2j4abcd",
        temporary / f"gymhost-sockets-{pid}-{start}-{namespace}-{rest}",
    ]
    for folder in others:
        folder.mkdir()
    a_file = temporary / f"gymhost-mount-{pid}-{start}-{namespace}-afile"
    a_file.write_text("")
    target = temporary / "kept"
    target.mkdir()
    a_link = temporary / f"gymhost-mount-{pid}-{start}-{namespace}-alink"
    a_link.symlink_to(target)
    assert remove_orphaned() == [dead]
    assert all(folder.is_dir() for folder in others)
    assert a_file.exists()
    assert a_link.is_symlink()
    assert target.is_dir()
