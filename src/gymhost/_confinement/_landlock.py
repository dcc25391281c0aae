"""The ``landlock`` level: where no namespaces may be made (Docker's and Kubernetes' ``RuntimeDefault`` seccomp
profile refuses them; a masked ``/proc``), each instance still confines itself where it begins, with what any
process may do to itself: its limits (``_limits``), then Landlock (the kernel's own sandbox for unprivileged
processes, through ``landlockpy``) and a seccomp filter (through ``pyseccomp``, over the system's libseccomp), which
``RuntimeDefault`` allows.

What an instance may then reach: it reads the interpreter, its bundle less its tasks, and the system's folders
(``/usr``, ``/etc`` less its entries only root may read, ``/proc``, ``/sys``), nothing else of the machine (not the
served folder, not another instance's scratch); it writes only its own scratch (a folder in the instances' folder,
made for it and removed with it; its working directory, ``TMPDIR`` and ``HOME``) and the harmless devices; unless
its folder asks for the network, it connects to nothing (Landlock's TCP rules; seccomp refuses every socket but a
Unix one, UDP included, and ``connect`` itself: no sibling's channel either); it can signal no process
outside its own (Landlock's scope, from ABI 6: not its template, not the server); it cannot ``ptrace`` what is
outside its domain; root keeps its uid, but none of its capabilities. What namespaces give and this does
not: a PID namespace (it sees the host's processes, and their command lines, in ``/proc``), a user of its own when
the server is root (it keeps root's reading of ``/etc``'s subfolders), a scratch bounded in size.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from .._config import secret_file
from ._base import DEFAULT_SCRATCH_BYTES, Level, interpreter_paths
from ._limits import Limits
from ._rules import Rules

__all__ = ["SYSTEM_FOLDERS", "Landlock", "missing", "restrict", "scratch_of"]

# What any program reads: the system's code, its settings, the kernel's views of itself.
SYSTEM_FOLDERS: Final = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/proc", "/sys")
_DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


class Landlock:
    level: Level = "landlock"

    def __init__(self, description: str) -> None:
        self.description = description

    def command(
        self,
        argv: Sequence[str],
        *,
        readable: Sequence[Path],
        writable: Sequence[Path],
        network: bool = False,
        workdir: Path | None = None,
        unreadable: Sequence[Path] = (),
    ) -> list[str]:
        return list(argv)  # each instance confines itself (``restrict``); its template runs as the server does

    def environment(self) -> dict[str, str]:
        return {}

    def rules(
        self,
        *,
        hidden: Sequence[Path],
        limits: Limits,
        network: bool = False,
        readable: Sequence[Path] = (),
        unreadable: Sequence[Path] = (),
    ) -> Rules:
        # The instances' scratches are made in the first folder hidden from them: the instances' own, the server's.
        return Rules(
            user=None,
            scratch_bytes=0,
            hidden=tuple(str(folder) for folder in hidden),
            network=network,
            # No file bigger than a confined instance's scratch: its own has no size (the disk's).
            limits=replace(limits, file_bytes=DEFAULT_SCRATCH_BYTES),
            namespaces=False,
            # The interpreter as the server sees it: in an instance, the path starts with its template's working
            # directory, the served folder.
            readable=tuple(str(folder) for folder in [*interpreter_paths(), *readable]),
            landlock=True,
            # And the secret gymhost keeps, should a readable folder hold it (a home on the path).
            unreadable=tuple(str(path) for path in [*unreadable, *_kept_secret()]),
        )

    def hand_over(self, folder: Path) -> Path:
        return folder  # the server's own user, who may write there already


def _kept_secret() -> list[Path]:
    kept = secret_file()
    return [kept.parent] if kept is not None else []


def scratch_of(channel: str) -> str:
    """An instance's scratch at this level: beside its channel's socket, in the instances' folder (the server
    removes it with the instance)."""
    return f"{channel}.scratch"


def missing(abi: int) -> str:
    """What Landlock ``abi`` leaves out of this level, in words for its description ("" for nothing)."""
    if abi >= 6:
        return ""
    return "; below Landlock ABI 6 (Linux 6.12), signals to processes beyond an instance are not refused"


def restrict(rules: Rules, scratch: str) -> None:
    """In a new instance, after its limits and ``PR_SET_NO_NEW_PRIVS``: Landlock, then the seccomp filter. Raises
    ``OSError`` where the kernel refuses either (the instance then ends, and says why)."""
    import landlockpy
    import pyseccomp  # type: ignore[import-untyped]

    if landlockpy.abi_version() < 1:
        raise OSError(errno.ENOSYS, "this kernel has no Landlock")
    scopes = landlockpy.Scope.SIGNAL | landlockpy.Scope.ABSTRACT_UNIX_SOCKET
    net = (
        landlockpy.AccessNet.NONE if rules.network else landlockpy.AccessNet.BIND_TCP | landlockpy.AccessNet.CONNECT_TCP
    )
    read = landlockpy.AccessFS.READ_FILE | landlockpy.AccessFS.READ_DIR | landlockpy.AccessFS.EXECUTE
    with landlockpy.Ruleset(handled_net=net, scoped=scopes) as ruleset:
        for path, listed_only in _readable(rules):
            if listed_only:
                ruleset.allow_path(path, landlockpy.AccessFS.READ_DIR)
            else:
                ruleset.allow_path(path, read if os.path.isdir(path) else read & ~landlockpy.AccessFS.READ_DIR)
        for device in _DEVICES:
            if os.path.exists(device):
                ruleset.allow_path(device, landlockpy.AccessFS.READ_FILE | landlockpy.AccessFS.WRITE_FILE)
        devices = landlockpy.AccessFS.MAKE_BLOCK | landlockpy.AccessFS.MAKE_CHAR
        ruleset.allow_path(scratch, ruleset.handled_fs & ~devices)  # its own scratch: everything but device files
        ruleset.restrict()
    refuse = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # A file truncated by its path, which Landlock covers only from ABI 3 (Linux 6.2): the served folder's.
    refuse.add_rule(pyseccomp.ERRNO(errno.EACCES), "truncate")
    if not rules.network:
        refuse.add_rule(pyseccomp.ERRNO(errno.EACCES), "socket", pyseccomp.Arg(0, pyseccomp.NE, socket.AF_UNIX))
        # No connection at all, a Unix one included: its siblings' channels and abstract sockets, which Landlock
        # covers only from ABI 9 and 6. An instance serves its channel; it never connects.
        refuse.add_rule(pyseccomp.ERRNO(errno.EACCES), "connect")
        refuse.add_rule(pyseccomp.ERRNO(errno.EACCES), "io_uring_setup")  # its sockets would bypass the rules above
    refuse.load()


@functools.cache
def _readable(rules: Rules) -> tuple[tuple[str, bool], ...]:
    """The system's folders, ``/etc``'s entries that any user may read (not ``/etc/shadow``, whoever the server
    runs as), and what the rules name (the interpreter, the bundle), less what they name unreadable (``_carved``),
    each with whether it may only be listed. Found once, by the template as it restricts itself: its forks, an
    instance an episode, inherit the answer."""
    paths = [folder for folder in SYSTEM_FOLDERS if os.path.exists(folder)]
    try:
        entries = os.scandir("/etc")
    except OSError:
        entries = None
    if entries is not None:
        with entries:
            for entry in entries:
                try:
                    if entry.stat().st_mode & stat.S_IROTH:
                        paths.append(entry.path)
                except OSError:
                    continue
    paths += [path for path in rules.readable if os.path.exists(path)]
    unreadable = [Path(path).resolve() for path in rules.unreadable]
    return tuple(grant for path in paths for grant in _carved(Path(path), Path(path).resolve(), unreadable, set()))


def _carved(path: Path, root: Path, unreadable: Sequence[Path], seen: set[Path]) -> list[tuple[str, bool]]:
    """``path`` (found under the named ``root``) granted whole, unless something unreadable lies below it (a served
    folder under ``/usr``, a bundle's tasks): a Landlock rule covers everything beneath its path, so then ``path``
    may only be listed (an import finds its modules by listing; the names below it are seen, not read), and each of
    its entries is granted the same way, but those out of sight (``_out_of_sight``; a link that leads nowhere is
    left out too: Landlock cannot grant it)."""
    real = path.resolve()
    below = [folder for folder in unreadable if real in folder.parents]
    if not below:
        return [(str(path), False)]
    if real in seen:  # (a link back up the tree)
        return []
    seen.add(real)
    grants = [(str(real), True)]
    try:
        entries = sorted(real.iterdir())
    except OSError:
        return grants
    for entry in entries:
        target = entry.resolve()
        if target.exists() and not _out_of_sight(target, root, unreadable):
            grants += _carved(entry, root, unreadable, seen)
    return grants


def _out_of_sight(target: Path, root: Path, unreadable: Sequence[Path]) -> bool:
    """Whether ``target`` is, or is inside, something unreadable. A path named readable (``root``) inside something
    unreadable stays readable, the deeper of the two deciding, and so does what is inside it; not what a link in it
    leads to elsewhere in that unreadable folder (a bundle's link to its served folder's rows)."""
    within_root = target == root or root in target.parents
    return any(
        (target == folder or folder in target.parents)
        and not (within_root and (folder == root or folder in root.parents))
        for folder in unreadable
    )
