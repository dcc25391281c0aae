"""What ``gymhost serve`` was asked to serve, resolved before anything is built: paths, Gym roots and bare names.

A user has Gym's servers where ``pip install nemo-gym`` put them (``site-packages/resources_servers/<name>/``, a
namespace package with no ``__file__``), folders ``gymhost write`` made, and Gym roots holding several. So a path
that exists is a folder or a root; a bare name that is no path names an installed Gym server; several of either are
served together, one gateway with each at ``/<name>``; ``only`` picks servers of a root. Every mistake is found here,
with the fix, before a port is bound or nemo-gym imported.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import FolderError, NemoGymNotInstalledError
from ._folder import existing_folder

__all__ = ["Target", "installed_servers", "resolve_targets", "server_folder", "server_folders"]

_RESOURCES_SERVERS = "resources_servers"


@dataclass(frozen=True)
class Target:
    """One server's ``folder``, or a gateway's ``mounts`` (prefix to folder), or a whole Gym ``root``."""

    name: str  # what the serving line calls it
    folder: Path | None = None
    root: Path | None = None
    mounts: dict[str, Path] | None = None

    @property
    def gateway(self) -> bool:
        return self.folder is None

    @property
    def served(self) -> Path | dict[str, Path]:
        """What ``load_app`` builds: the folder, the root, or the mounts."""
        if self.folder is not None:
            return self.folder
        if self.mounts is not None:
            return self.mounts
        assert self.root is not None
        return self.root

    def folders(self) -> dict[str, Path]:
        """Every server folder it serves, by prefix (a single folder's is "")."""
        if self.folder is not None:
            return {"": self.folder}
        if self.mounts is not None:
            return dict(self.mounts)
        assert self.root is not None
        return {f"/{name}": folder for name, folder in server_folders(self.root / _RESOURCES_SERVERS).items()}


def installed_servers() -> Path | None:
    """The ``resources_servers`` folder of the installed nemo-gym (found without importing nemo-gym), if any."""
    try:
        spec = importlib.util.find_spec(_RESOURCES_SERVERS)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if server_folders(Path(location)):
            return Path(location)
    return None


def server_folders(base: Path) -> dict[str, Path]:
    """``{name: folder}`` of the resources-server folders (folders with ``configs/``) directly in ``base``."""
    if not base.is_dir():
        return {}
    return {p.name: p for p in sorted(base.iterdir()) if (p / "configs").is_dir() and not p.name.startswith(".")}


def resolve_targets(paths: Sequence[str], *, only: Sequence[str] = ()) -> Target:
    """What ``paths`` (and ``only``) ask to serve; a ``FolderError`` naming the fix when they ask for nothing."""
    if not paths:
        raise FolderError("name what to serve: a folder, a Gym root, or an installed Gym server's name")
    for given in paths:  # a folder mounted into a container is often not readable by the container's user
        path = Path(given).expanduser()
        if path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
            raise FolderError(
                f"{given}: this process (uid {os.getuid()}) cannot read it; make it readable to that user "
                f"(chmod -R a+rX {given})"
            )
    if len(paths) == 1:
        given = paths[0]
        path = Path(given).expanduser()
        if (path / _RESOURCES_SERVERS).is_dir():  # a Gym root
            root = path.resolve()
            if not only:
                return Target(root.name, root=root)
            available = server_folders(root / _RESOURCES_SERVERS)
            unknown = [name for name in only if name not in available]
            if unknown:
                raise FolderError(
                    f"--only {','.join(unknown)}: not in {root / _RESOURCES_SERVERS} (it has: {', '.join(available)})"
                )
            return Target(root.name, root=root, mounts={f"/{name}": available[name] for name in only})
        if only:
            raise FolderError(
                f"--only picks servers of a Gym root (a folder holding {_RESOURCES_SERVERS}/); {given} is not one"
            )
        folder = server_folder(given)
        return Target(folder.name, folder=folder)
    if only:
        raise FolderError("--only picks servers of one Gym root; name the servers themselves instead, or give one root")
    mounts: dict[str, Path] = {}
    for given in paths:
        if (Path(given).expanduser() / _RESOURCES_SERVERS).is_dir():
            raise FolderError(
                f"{given} is a Gym root: serve it alone (gymhost serve {given}, with --only to pick its servers), or "
                "name one server's folder for each path"
            )
        folder = server_folder(given)
        prefix = f"/{folder.name}"
        if prefix in mounts:
            raise FolderError(f"two servers would be served at {prefix}: {mounts[prefix]} and {folder}")
        mounts[prefix] = folder
    return Target("gateway", mounts=mounts)


def server_folder(given: str) -> Path:
    """One server's folder: an existing path, or the name of an installed Gym server (``gymhost serve NAME``,
    ``GYMHOST_FOLDER=NAME`` and ``create_app(NAME)`` alike)."""
    path = Path(given).expanduser()
    if path.is_dir():
        if not (path / "configs").is_dir() and server_folders(path):
            if path.resolve() == installed_servers():
                raise FolderError(
                    f"{given}: this folder holds the Gym servers nemo-gym installed, not one server: name the ones "
                    "to serve (gymhost serve NAME [NAME ...]; gymhost list shows them)"
                )
            raise FolderError(
                f"{given}: this folder holds servers, not one server: name the ones to serve (gymhost serve "
                f"{given.rstrip('/')}/NAME ...), or serve the Gym root above it (gymhost serve "
                f"{path.resolve().parent} --only NAME,NAME)"
            )
        return path.resolve()
    if path.exists() or "/" in given or given in (".", ".."):
        return existing_folder(given)  # says what is wrong, in the user's words
    installed = installed_servers()
    if installed is None:
        if importlib.util.find_spec("nemo_gym") is None:
            raise NemoGymNotInstalledError(f"nemo_gym (to serve the installed Gym server {given!r})")
        raise FolderError(f"{given}: no such folder, and the installed nemo-gym ships no resources servers")
    folders = server_folders(installed)
    if given in folders:
        return folders[given]
    close = difflib.get_close_matches(given, folders, n=3)
    version = importlib.metadata.version("nemo-gym")
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise FolderError(
        f"{given}: no such folder, and nemo-gym {version} ships no server of that name ({len(folders)} do: "
        f"gymhost list){hint}"
    )
