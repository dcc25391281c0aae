"""Whether several resources-server folders can share one Python process.

Gym gives every server its own venv, built from its folder's ``requirements.txt``. A gateway puts several folders
in one process, and so in one set of installed packages: two folders that need different versions of the same
package cannot both have theirs. This compares each folder's requirements with what is installed, using
``packaging`` (the library pip uses for the same job).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = ["FolderRequirement", "conflicts", "index_options", "requirement_lines", "requirements_of"]

logger = logging.getLogger("gymhost")

# The host itself: a folder's requirements name them, but they are what is running.
_HOST_PACKAGES = {"nemo-gym", "gymhost"}
# pip's comment: a # at a line's start or after whitespace (a URL's #subdirectory= or #sha256= is not one).
_COMMENT = re.compile(r"(^|\s)#.*$")
# pip's options that say where packages come from: what installs a folder's requirements must keep them.
_INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host", "--pre")
_INCLUDE = re.compile(r"^(-r|--requirement)(\s+|=)(?P<path>\S+)$")
_GYM_LINE = re.compile(r"^(-e\s+)?nemo[-_]gym\b", re.IGNORECASE)  # Gym's `-e nemo-gym[dev] @ ../../`: the host


@dataclass(frozen=True)
class FolderRequirement:
    package: str
    line: str
    installed: str | None
    met: bool


def requirement_lines(path: Path, *, _seen: frozenset[Path] = frozenset()) -> Iterator[str]:
    """The logical lines of a requirements file as pip reads them: continuations joined, comments and blank lines
    left out, the files its ``-r`` lines name read in their place (relative to the file naming them)."""
    path = path.resolve()
    if path in _seen or not path.is_file():
        return
    joined = ""
    for raw in path.read_text().splitlines():
        if raw.endswith("\\"):
            joined += raw[:-1] + " "
            continue
        line = _COMMENT.sub("", joined + raw).strip()
        joined = ""
        include = _INCLUDE.match(line)
        if include:
            yield from requirement_lines(path.parent / include.group("path"), _seen=_seen | {path})
        elif line:
            yield line


def index_options(folder: Path) -> list[str]:
    """The lines of ``folder/requirements.txt`` that say where its packages come from (an index, a links page)."""
    return [line for line in requirement_lines(folder / "requirements.txt") if line.startswith(_INDEX_OPTIONS)]


def requirements_of(folder: Path) -> Iterator[FolderRequirement]:
    """Each requirement of ``folder/requirements.txt`` (and the files it includes), and whether this process meets
    it: installed, at a version its specifier allows, with the dependencies of the extras it names. A line no
    requirement can be read from (a path, an editable install, an option) is said in the log and not checked."""
    for line in requirement_lines(folder / "requirements.txt"):
        text = line.split(" --", 1)[0].strip()  # a requirement's own options (--hash=...) are pip's business
        if text.startswith(_INDEX_OPTIONS) or _GYM_LINE.match(text):
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            logger.warning("%s: requirements.txt: %r is not checked here (not a requirement by name)", folder, line)
            continue
        package = canonicalize_name(requirement.name)
        if package in _HOST_PACKAGES or (requirement.marker is not None and not requirement.marker.evaluate()):
            continue
        installed = _installed(package)
        met = _allows(requirement, installed) and all(
            _allows(dependency, _installed(canonicalize_name(dependency.name)))
            for dependency in _extras_dependencies(package, requirement.extras)
        )
        yield FolderRequirement(package, line, installed, met)


def _installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _allows(requirement: Requirement, installed: str | None) -> bool:
    """As pip judges an installed version: a pre-release satisfies a specifier that it falls in."""
    return installed is not None and requirement.specifier.contains(installed, prereleases=True)


def _extras_dependencies(package: str, extras: set[str]) -> list[Requirement]:
    """What the installed ``package`` declares for ``extras`` (an extra it does not declare brings nothing, as
    pip warns), for this environment."""
    if not extras:
        return []
    try:
        declared = [Requirement(line) for line in requires(package) or []]
    except (PackageNotFoundError, InvalidRequirement):
        return []
    return [
        dependency
        for dependency in declared
        if dependency.marker is not None
        and not dependency.marker.evaluate({"extra": ""})
        and any(dependency.marker.evaluate({"extra": extra}) for extra in extras)
    ]


def conflicts(folders: Mapping[str, Path]) -> list[str]:
    """Why these folders cannot share this process: one needs a version of a package that another has installed.

    A requirement that is unmet but shared with nobody is only logged: the folder may still import, and when it
    does not, ``create_app`` names the missing module.
    """
    by_package: dict[str, list[tuple[str, FolderRequirement]]] = {}
    for prefix, folder in folders.items():
        for requirement in requirements_of(folder):
            by_package.setdefault(requirement.package, []).append((prefix, requirement))
    problems = []
    for package, wanted in by_package.items():
        met = sorted({prefix for prefix, requirement in wanted if requirement.met})
        for prefix, requirement in wanted:
            if requirement.met:
                continue
            if met:
                problems.append(
                    f"{prefix} needs {requirement.line}, but {package} {requirement.installed or '(none)'} is what "
                    f"{', '.join(met)} run with; serve them in separate processes (gymhost serve FOLDER for each)"
                )
            else:
                logger.warning(
                    "%s: %s is not met here (installed: %s)", folders[prefix], requirement.line, requirement.installed
                )
    return problems
