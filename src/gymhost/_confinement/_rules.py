"""What a confined process of hosted code does to itself, inside its sandbox: the part of the confinement that only
the process can do, because it happens after its start (the sandbox's own tool did the rest before it).

Two steps, each one call (a whole server of hosted code takes the first, ``enter_server``):

- ``drop_privileges`` at the process's start, before any hosted code is imported: a server run as root starts the
  sandbox as root (only root can make the server's Python, under a home or a folder no other user may enter,
  reachable inside it), and the hosted process then becomes an unprivileged user, for good: it cannot read what only
  root may (``/etc/shadow``, other users' files), signal the server, or write where the root file system's owners
  write (the read-only mounts aside, the venv and the folder are root's).
- ``fork_instance`` where an instance begins: a template forks each one into user, mount, IPC, network and PID
  namespaces of its own (it cannot name its template or its siblings, all the same user, to signal them; ``/proc``
  stays its template's, where it sees their numbers: the kernel refuses a proc of its own under the sandbox's
  read-only covers of ``/proc/sys`` and the like), where it confines itself: its own scratch (a bounded ``tmpfs``
  at ``/tmp``, its working directory), so nothing one instance writes reaches another; the instances' sockets folder
  covered, so it cannot call a sibling's channel; then no capabilities and no ``ptrace`` or ``/proc`` access to it
  by its siblings (``PR_SET_DUMPABLE`` 0). An instance started on its own (no template) does the same through
  ``enter_instance``, and the process it started as stays behind as its keeper.

The rules travel to the process as one JSON argument (``Rules.to_argument``), written by the server's confinement
(``_bubblewrap``).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import select
import signal
import socket
import struct
import sys
from dataclasses import asdict, dataclass, field
from typing import NoReturn

from ._limits import Limits, apply_limits

__all__ = ["Rules", "drop_privileges", "enter_instance", "enter_server", "enter_template", "fork_instance"]

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x2000, 0x4000, 0x40000
_SCRATCH = "/tmp"  # each instance's scratch, and its working directory
_CAPABILITY_VERSION_3 = 0x20080522
_SIOCSIFFLAGS, _IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40


@dataclass(frozen=True)
class Rules:
    """How a process of hosted code confines itself: ``user`` (uid, gid) to become at its start (None: it is not
    root, and stays who it is); each instance's scratch of ``scratch_bytes``; ``hidden``: folders of the server's
    an instance must not see (the instances' sockets); ``network``: False gives each instance a network namespace
    of its own, with nothing but its loopback; ``limits``: what each instance may take (``_limits``);
    ``namespaces`` False: no namespaces at all (where none may be made): the limits, and, with ``landlock``, the
    restrictions of ``_landlock`` (``readable``: what an instance may read besides the system's folders: the
    interpreter, the bundle; ``unreadable``: what it may not, inside those: the bundle's tasks)."""

    user: tuple[int, int] | None
    scratch_bytes: int
    hidden: tuple[str, ...] = field(default=())
    network: bool = False
    limits: Limits = field(default_factory=Limits)
    namespaces: bool = True
    readable: tuple[str, ...] = field(default=())
    landlock: bool = False
    unreadable: tuple[str, ...] = field(default=())

    def to_argument(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_argument(cls, text: str) -> Rules:
        given = json.loads(text)
        user = given.get("user")
        return cls(
            user=(int(user[0]), int(user[1])) if user is not None else None,
            scratch_bytes=int(given["scratch_bytes"]),
            hidden=tuple(str(path) for path in given.get("hidden", ())),
            network=bool(given.get("network", False)),
            limits=Limits(**{name: None if n is None else int(n) for name, n in given.get("limits", {}).items()}),
            namespaces=bool(given.get("namespaces", True)),
            readable=tuple(str(path) for path in given.get("readable", ())),
            landlock=bool(given.get("landlock", False)),
            unreadable=tuple(str(path) for path in given.get("unreadable", ())),
        )


def drop_privileges(rules: Rules) -> None:
    """Become ``rules.user`` for good (all three uids and gids, no supplementary groups): the kernel clears every
    capability when root becomes another user. A process not started as root has nothing to drop."""
    if rules.user is None or os.getuid() != 0:
        return
    uid, gid = rules.user
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def enter_template(rules: Rules) -> None:
    """Confine a template (or the probe that stands for one) before it imports any hosted code: its user dropped
    (``drop_privileges``); where no namespaces hold it (``landlock``), restricted as its instances will be, but
    writing in the instances' folder (their sockets and scratches), where each instance then restricts itself
    further (Landlock's rules stack)."""
    drop_privileges(rules)
    if rules.landlock:
        import tempfile

        from ._landlock import restrict

        os.environ["TMPDIR"] = rules.hidden[0]  # the one folder it writes: what it makes there goes with the server
        tempfile.tempdir = None
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        restrict(rules, rules.hidden[0])
        _drop_capabilities()


def enter_server(rules: Rules) -> None:
    """Confine this process as a whole server of hosted code (a Gym server run under ``--sandbox strict``, started in
    its sandbox by ``_serving._confined``), before the server's code is imported: its user dropped, and, since the
    children it starts on the model's text run as that same user, not dumpable (``not_dumpable``)."""
    drop_privileges(rules)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    not_dumpable()


def not_dumpable() -> None:
    """This server process not dumpable, confined or not: what it starts for the model runs as its user, and a
    process of the same user may otherwise ``ptrace`` it, read its memory and environment through ``/proc`` (the
    signing secret, the token) and copy its descriptors with ``pidfd_getfd`` (its listening socket and the trainer's
    connections: it could answer a ``/verify`` itself). Root's children keep ``CAP_SYS_PTRACE``, which this does not
    touch (under ``--sandbox strict`` they are not root). What it costs: the user's own debuggers and profilers
    (py-spy, gdb) reach the server only as root. The programs it starts are dumpable again (``execve``). Linux's
    alone: elsewhere nothing is done."""
    if sys.platform == "linux":
        _prctl(_PR_SET_DUMPABLE, 0)


def fork_instance(rules: Rules, scratch: str = "") -> tuple[int, int]:
    """Fork this process into a new instance, confined: ``(pid, pidfd)`` in this process; ``(0, -1)`` in the
    instance, which has confined itself by then (its own namespaces and scratch, the server's folders covered, no
    capabilities, not dumpable) and dies with this process. Raises ``OSError`` when the kernel refuses.
    ``scratch``: the folder an instance without namespaces of its own makes and keeps its files in (``landlock``).

    One ``clone3`` makes the child in user, mount, IPC, network and PID namespaces of its own, the first process of
    its PID namespace (so it can name no process but its own, and whatever it starts goes with it), with a pidfd:
    the price of a fork, where ``unshare`` would need a second fork and a process left waiting."""
    flags = _CLONE_PIDFD
    if rules.namespaces:
        flags |= os.CLONE_NEWUSER | os.CLONE_NEWNS | os.CLONE_NEWIPC | os.CLONE_NEWPID
    if rules.namespaces and not rules.network:
        flags |= os.CLONE_NEWNET
    uid, gid = os.getuid(), os.getgid()
    kept = _mounted_under(_SCRATCH, excluding=rules.hidden) if rules.namespaces else ()  # read once: they do not change
    if rules.landlock:
        import landlockpy  # noqa: F401  (imported here, once: pyseccomp's import runs ldconfig to find libseccomp)
        import pyseccomp  # type: ignore[import-untyped]  # noqa: F401
    parent_alive, parent = _parent_pipe()
    pid, pidfd = _clone3(flags)
    if pid != 0:
        return pid, pidfd
    try:
        os.close(parent)
        _libc_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if select.select([parent_alive], [], [], 0)[0]:  # the parent died before that took effect
            os._exit(1)
        os.close(parent_alive)  # the kernel's signal is set: the pipe has told what it could
        if rules.namespaces:
            _confine(rules, uid, gid, kept)
        else:  # no namespaces may be made here: the limits, and what Landlock and seccomp give
            apply_limits(rules.limits)
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)
            if rules.landlock:
                _restrict(rules, scratch)
                _drop_capabilities()  # a root server's instance stays root, with none of root's capabilities
            _prctl(_PR_SET_DUMPABLE, 0)
    except BaseException as error:  # nothing may return into the parent's code
        print(f"gymhost: an instance could not confine itself: {error}", file=sys.stderr, flush=True)
        os._exit(1)
    return 0, -1


def _restrict(rules: Rules, scratch: str) -> None:
    """An instance without namespaces of its own: its scratch made afresh (what a predecessor of the same channel
    left is gone), its working directory and temporary folder, then ``_landlock``'s restrictions."""
    import tempfile

    from .._scratch import remove
    from ._landlock import restrict

    remove(scratch)
    os.mkdir(scratch, 0o700)
    os.chdir(scratch)
    os.environ.update(TMPDIR=scratch, HOME=scratch)
    tempfile.tempdir = None  # found again from TMPDIR
    restrict(rules, scratch)


def enter_instance(rules: Rules, scratch: str = "") -> None:
    """Confine this process as one instance (an instance started on its own, not forked from a template): returns
    in the confined instance, a child of this process (``fork_instance``); this process stays behind as its keeper,
    never returning: it passes the server's signals on and exits with the instance's status (``_keep``)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the keeper waits for its instance
    pid, pidfd = fork_instance(rules, scratch)
    if pid != 0:
        os.close(pidfd)
        _drop_capabilities()
        _keep(pid)


def _confine(rules: Rules, uid: int, gid: int, kept: tuple[str, ...]) -> None:
    """In the new instance: the rest of its confinement, which only it can do (``kept``: what is mounted under its
    scratch, to mount again in its own)."""
    # A process that changed its uid (``drop_privileges``) is not dumpable, and its /proc files are root's: writing
    # its own uid map needs them its own for a moment.
    _prctl(_PR_SET_DUMPABLE, 1)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    if not rules.network:
        _loopback_up()
    _mount("none", "/", "", _MS_REC | _MS_PRIVATE, None)  # nothing mounted here propagates back
    _fresh_scratch(rules, kept)
    for folder in rules.hidden:
        if os.path.isdir(folder):  # still in sight: not under the scratch
            _mount("tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4096,mode=0")
    os.chdir(_SCRATCH)
    _drop_capabilities()
    apply_limits(rules.limits)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_DUMPABLE, 0)  # siblings run as the same user: none may ptrace this one or read its memory


class _CloneArgs(ctypes.Structure):
    """``struct clone_args`` as Linux 5.3 has it (``CLONE_ARGS_SIZE_VER0``)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls")
    ]


def _clone3(flags: int) -> tuple[int, int]:
    """``clone3`` as ``os.fork`` forks (Python's own before- and after-fork work around it, the GIL held
    throughout): ``(pid, pidfd)`` in the parent, ``(0, -1)`` in the child."""
    pidfd = ctypes.c_int(-1)
    arguments = _CloneArgs(flags=flags, pidfd=ctypes.addressof(pidfd), exit_signal=signal.SIGCHLD)
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _syscall(_SYS_CLONE3, ctypes.byref(arguments), ctypes.c_size_t(ctypes.sizeof(arguments)))
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0, -1
    number = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        if number == errno.ENOSPC:  # the kernel's own word for it says nothing of namespaces
            raise OSError(number, "no more user namespaces may be made here (user.max_user_namespaces)")
        raise OSError(number, f"clone3: {os.strerror(number)}")
    return int(pid), pidfd.value


_parent_ends: tuple[int, int] | None = None


def _parent_pipe() -> tuple[int, int]:
    """A pipe whose write end only this process keeps (each child closes its copy at once): its end of file, in a
    child, says this process has died."""
    global _parent_ends
    if _parent_ends is None:
        _parent_ends = os.pipe()
    return _parent_ends


def _loopback_up() -> None:
    """Its network namespace's loopback, up (a new one starts down): code that serves and calls itself on
    localhost, a database an environment starts, works as it does outside."""
    fd = _libc_socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)
    if fd < 0:
        _raise("socket")
    try:
        if _libc_ioctl(fd, _SIOCSIFFLAGS_ARGUMENT, _LOOPBACK_UP) != 0:
            _raise("the loopback up")
    finally:
        os.close(fd)


def _fresh_scratch(rules: Rules, kept: tuple[str, ...]) -> None:
    """A new, empty ``/tmp`` of its own, with what the sandbox bound under the old one (the interpreter, the venv or
    the bundle, when they live in a temporary folder) bound again in it: made aside, then moved into place. Aside
    is where nothing else is lost: a hidden folder of the server's (the sockets), covered by it meanwhile. With
    nothing to bind again (a server whose folders are not temporary ones), it is mounted in place at once, which
    covers whatever of the server's was under the old one."""
    aside = rules.hidden[0] if rules.hidden else None
    if aside is None or not kept:
        _mount("tmpfs", _SCRATCH, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={rules.scratch_bytes},mode=1777")
        return
    _mount("tmpfs", aside, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={rules.scratch_bytes},mode=1777")
    for path in kept:
        again = os.path.join(aside, os.path.relpath(path, _SCRATCH))
        os.makedirs(again, mode=0o755, exist_ok=True)
        try:
            _mount(path, again, "", _MS_BIND | _MS_REC, None)  # read-only stays read-only: the kernel locks it so
        except FileNotFoundError:
            if os.path.exists(path):
                raise
            # Out of reach: the machine's own, under the /tmp the sandbox covered with its own (another program's
            # tmpfs, a build's chroot), or unmounted since the template read the mounts. Nothing to see again.
    _mount(aside, _SCRATCH, "", _MS_MOVE, None)


@functools.cache
def _mounted_under(folder: str, *, excluding: tuple[str, ...]) -> tuple[str, ...]:
    """The outermost mount points below ``folder`` (``/proc/self/mountinfo``), the ``excluding`` ones aside."""
    points = []
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            point = _unescape(line.split()[4])
            if point.startswith(folder.rstrip("/") + "/") and not any(
                point == other or point.startswith(other.rstrip("/") + "/") for other in excluding
            ):
                points.append(point)
    outermost = [point for point in points if not any(point.startswith(other + "/") for other in points)]
    return tuple(sorted(set(outermost)))


def _unescape(field: str) -> str:
    """mountinfo writes a space, a tab, a newline and a backslash in a path as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _keep(instance: int) -> NoReturn:
    """The keeper: the server's signals passed on to the instance (the first process of its namespace ignores the
    ones it has no handler for), and this process's exit the instance's."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda received, _: os.kill(instance, received))
    while True:
        try:
            _, status = os.waitpid(instance, 0)
        except ChildProcessError:
            os._exit(1)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


_libc = ctypes.CDLL(None, use_errno=True)
# ``syscall`` through a library handle that keeps the GIL held across the call, as ``os.fork`` forks.
_syscall = ctypes.PyDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
_SYS_CLONE3 = 435  # the same number on x86-64 and arm64
_CLONE_PIDFD = 0x1000


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


# Made once, in the template, for every instance it forks: the C library's functions looked up, and what they are
# given. A new instance that makes its first Python socket, ctypes object or text file copies each page of the
# template's that this first use writes: a third of its confinement's CPU, until it called the C library with these
# (benchmarks/README.md, "Confined process instances").
_NO_CAPABILITIES = (ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), (_CapData * 2)())
# A ``struct ifreq`` (40 bytes on 64-bit Linux, all of which the kernel copies in): the name and the flags, zeros after.
_LOOPBACK_UP = ctypes.create_string_buffer(struct.pack("16sH22x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING))
_SIOCSIFFLAGS_ARGUMENT = ctypes.c_ulong(_SIOCSIFFLAGS)
_libc_socket, _libc_ioctl, _libc_capset = _libc.socket, _libc.ioctl, _libc.capset
_libc_mount, _libc_prctl = _libc.mount, _libc.prctl


def _drop_capabilities() -> None:
    """None left, and none to gain back: the namespaces' own capabilities would let hosted code undo its mounts."""
    cap = 0
    while _libc_prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    header, data = _NO_CAPABILITIES
    if _libc_capset(header, data) != 0:
        _raise("capset")


def _mount(source: str, target: str, kind: str, flags: int, data: str | None) -> None:
    if _libc_mount(source.encode(), target.encode(), kind.encode(), flags, data.encode() if data else None) != 0:
        _raise(f"mount {target}")


def _prctl(option: int, value: int) -> None:
    if _libc_prctl(option, value, 0, 0, 0) != 0:
        _raise(f"prctl {option}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())  # one write: a map of /proc is taken whole or refused
    finally:
        os.close(fd)


def _raise(what: str) -> None:
    number = ctypes.get_errno()
    raise OSError(number, f"{what}: {os.strerror(number)}")
