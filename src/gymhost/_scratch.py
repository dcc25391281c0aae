"""gymhost's private folders under the temporary directory, and none left behind when their maker dies.

A server makes folders there for what must not be reachable by others or be named by a port: its workers' sockets
and metrics (``workers``), a gateway's shared metrics (``metrics``), a process mount's socket (``mount``), process
instances' sockets (``instances``), agent-env's app and its stores (``agent-env``). The process that made one removes
it when it stops (``remove``); one killed (SIGKILL, the OOM killer) cannot. So each folder is named for its maker:

    gymhost-<kind>-<pid>-<start>-<pidns>-<random>

``start`` is the maker's start time (``/proc/<pid>/stat``), which tells it from a later process given the same pid;
``pidns`` its PID namespace, in which alone its pid means it. Every start of gymhost, and every new folder, first
removes the folders whose maker is gone (``remove_orphaned``): so a folder of a killed process goes when its parent,
which outlives it, starts it again (a supervisor's worker, a gateway's process mount), or when the next server
starts. A folder of another namespace, another user, or another shape is never touched: its maker cannot be seen
from here.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Final, Literal, get_args

__all__ = ["Kind", "maker_gone", "maker_stamp", "remove", "remove_orphaned", "scratch_folder"]

Kind = Literal["workers", "metrics", "mount", "instances", "agent-env"]
_KINDS: Final[tuple[str, ...]] = get_args(Kind)
_STAMP: Final = re.compile(r"(?P<pid>\d+)-(?P<start>\d+)-(?P<pidns>\d+)")
_NAME: Final = re.compile(rf"gymhost-(?P<kind>{'|'.join(map(re.escape, _KINDS))})-(?P<stamp>\d+-\d+-\d+)-[a-z0-9_]+")


def scratch_folder(kind: Kind) -> Path:
    """A new private folder (mode 0700) of this process, under the temporary directory; folders of makers that are
    gone are removed first."""
    if kind not in _KINDS:
        raise ValueError(f"{kind!r} is no kind of gymhost folder; one of {', '.join(_KINDS)}")
    remove_orphaned()
    return Path(tempfile.mkdtemp(prefix=f"gymhost-{kind}-{maker_stamp()}-"))


def maker_stamp() -> str:
    """This process, as a folder's name tells its maker: ``<pid>-<start>-<pidns>``."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid)}-{_pid_namespace()}"


def maker_gone(stamp: str) -> bool:
    """Whether the process a ``maker_stamp`` names is gone; never for one of another PID namespace, which cannot be
    seen from here, nor for a stamp of another shape."""
    match = _STAMP.fullmatch(stamp)
    if match is None or int(match["pidns"]) != _pid_namespace():
        return False
    return _start_time(int(match["pid"])) != int(match["start"])


def remove(folder: Path | str) -> None:
    """A folder's maker is done with it (or a process that outlived its maker found it): gone, whatever it holds,
    a folder inside it that hosted code made unreadable (``chmod 0``) included."""
    shutil.rmtree(folder, ignore_errors=True)
    if os.path.lexists(folder):
        _unlock(str(folder))
        shutil.rmtree(folder, ignore_errors=True)


def _unlock(folder: str) -> None:
    """Every folder under ``folder`` (never through a link) readable, writable and enterable by its owner."""
    try:
        os.chmod(folder, 0o700)
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _unlock(entry.path)


def remove_orphaned() -> list[Path]:
    """Remove the folders (of any kind) whose maker is gone; the ones removed."""
    removed = []
    root = Path(tempfile.gettempdir())
    uid = os.getuid()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or not maker_gone(match["stamp"]):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:  # removed meanwhile
            continue
        remove(Path(entry.path))
        removed.append(Path(entry.path))
    return removed


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); None if there is none, or only its zombie (it has
    exited: its parent has yet to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold anything
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no namespaces to tell apart here
        return 0
