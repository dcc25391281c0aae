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
from packaging.version import InvalidVersion

__all__ = [
    "FolderRequirement",
    "conflicts",
    "host_extras",
    "index_options",
    "requirement_lines",
    "requirements_of",
    "unchecked",
]

logger = logging.getLogger("gymhost")

# The host itself: a folder's requirements name them, but they are what is running.
_HOST_PACKAGES = {"nemo-gym", "gymhost"}
# pip's comment (req_file.COMMENT_RE): a # at a line's start or after whitespace (a URL's #subdirectory= is not one).
_COMMENT = re.compile(r"(^|\s+)#.*$")
# pip's options that say where packages come from: what installs a folder's requirements must keep them.
_INDEX_OPTIONS = frozenset(
    {"-i", "--index-url", "--extra-index-url", "--no-index", "-f", "--find-links", "--trusted-host", "--pre"}
)
_INCLUDES = frozenset({"-r", "--requirement"})
_CONSTRAINTS = frozenset({"-c", "--constraint"})
_EDITABLE = frozenset({"-e", "--editable"})
# An option, long or short (a short one's value may follow it at once: -rmore.txt).
_OPTION = re.compile(r"^(?P<name>--[a-z][a-z-]*|-[a-zA-Z])(=|\s+)?(?P<value>.*)$")
_URL = re.compile(r"^(https?|file):", re.IGNORECASE)  # pip reads an -r or -c that is a URL from there
# Gym's own line: `-e nemo-gym[dev] @ ../../`, or `-e ../../[dev]`, its checkout: the host, which is what runs.
_GYM_LINE = re.compile(
    r"^((-e|--editable)\s+)?(nemo[-_]gym(?P<named>\[[^\]]*\])?(\s*@.*)?|\.\./\.\./?(?P<checkout>\[[^\]]*\])?)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class FolderRequirement:
    package: str
    line: str  # the requirement as written, without its own options (``--hash``: pip's business)
    installed: str | None
    allowed: bool  # installed, at a version it allows
    met: bool  # allowed, and the dependencies of the extras it names installed too
    pins: bool  # it names versions (a bare name takes any)


def requirement_lines(path: Path, *, _seen: frozenset[Path] = frozenset()) -> Iterator[str]:
    """The logical lines of a requirements file as pip reads them (pip's ``join_lines``, then its comments): a line
    ending in a backslash is joined to the next unless it is a comment line, comments and blank lines are left out,
    the files its ``-r`` lines name are read in their place and its ``-c`` files named by absolute path (both
    relative to the file naming them; a URL, or a file that is not there, is left as its line)."""
    path = path.resolve()
    if path in _seen or not path.is_file():
        return
    pending: list[str] = []
    for raw in [*path.read_text().splitlines(), None]:
        if raw is not None and raw.endswith("\\") and not _COMMENT.match(raw):
            pending.append(raw.strip("\\"))
            continue
        if raw is not None and _COMMENT.match(raw):
            raw = " " + raw  # as pip does, so that the comment is one after the join
        logical = "".join([*pending, *([raw] if raw is not None else [])])
        pending = []
        line = _COMMENT.sub("", logical).strip()
        option = _OPTION.match(line)
        value = option.group("value").strip() if option else ""
        if option and value and not _URL.match(value) and option.group("name") in _INCLUDES | _CONSTRAINTS:
            named = (path.parent / value).resolve()
            if option.group("name") in _CONSTRAINTS:
                yield f"-c {named}"
            elif named.is_file():
                yield from requirement_lines(named, _seen=_seen | {path})
            elif named not in _seen:
                yield line  # left for unchecked(), which says so
        elif line:
            yield line


def index_options(folder: Path) -> list[str]:
    """The lines of ``folder/requirements.txt`` that say where its packages come from (an index, a links page)."""
    return [line for line in requirement_lines(folder / "requirements.txt") if _option_name(line) in _INDEX_OPTIONS]


def requirements_of(folder: Path) -> Iterator[FolderRequirement]:
    """Each requirement of ``folder/requirements.txt`` (and the files it includes), and whether this process meets
    it: installed, at a version its specifier allows, with the dependencies of the extras it names. Lines that
    name no package (a path, a URL, an editable install) are ``unchecked``'s."""
    for line in requirement_lines(folder / "requirements.txt"):
        requirement = _requirement(line)
        if requirement is None:
            continue
        package = canonicalize_name(requirement.name)
        if package in _HOST_PACKAGES or (requirement.marker is not None and not requirement.marker.evaluate()):
            continue
        installed = _installed(package)
        allowed = _allows(requirement, installed)
        met = allowed and all(
            _allows(dependency, _installed(canonicalize_name(dependency.name)))
            for dependency in _extras_dependencies(package, requirement.extras)
        )
        yield FolderRequirement(package, _written(line), installed, allowed, met, bool(requirement.specifier))


def unchecked(folder: Path) -> list[str]:
    """The lines of ``folder/requirements.txt`` that install something gymhost cannot judge: a path, a URL, an
    editable install, a file to include that is not there or is a URL (Gym's own line, the host, aside)."""
    return [
        line
        for line in requirement_lines(folder / "requirements.txt")
        if _requirement(line) is None
        and (_option_name(line) in _EDITABLE | _INCLUDES or _option_name(line) is None)
        and not _GYM_LINE.match(line)
    ]


def _written(line: str) -> str:
    """A requirement's line without its own options (``--hash``: pip's business)."""
    return line.split(" --", 1)[0].strip()


def _requirement(line: str) -> Requirement | None:
    """The requirement a line names; None for an option, the host's line, or a line naming no package."""
    text = _written(line)
    if _option_name(text) is not None or _GYM_LINE.match(text):
        return None
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def host_extras(line: str) -> str | None:
    """Gym's own line (``-e nemo-gym[dev] @ ../../``, ``-e ../../[dev]``: what runs, never installed for a
    folder): the extras it asks for (``"[dev]"``, or ``""``); None for any other line."""
    match = _GYM_LINE.match(line)
    if match is None:
        return None
    return match.group("named") or match.group("checkout") or ""


def _option_name(line: str) -> str | None:
    option = _OPTION.match(line)
    return option.group("name") if option else None


def _installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _allows(requirement: Requirement, installed: str | None) -> bool:
    """As pip judges an installed version: any, for a requirement without a specifier; else one the specifier holds,
    pre-releases included; a version that is not PEP 440's (packaging 24 raises on it) is not one it holds."""
    if installed is None:
        return False
    if not requirement.specifier:
        return True
    try:
        return requirement.specifier.contains(installed, prereleases=True)
    except InvalidVersion:
        return False


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
        for prefix, requirement in wanted:
            if requirement.met:
                continue
            # A version another folder runs with: this one cannot have its own in the same process. (An extra's
            # missing dependency is no clash: installing it changes no other folder's version.)
            others = sorted({other for other, theirs in wanted if theirs.allowed and theirs.pins and other != prefix})
            if not requirement.allowed and others:
                problems.append(
                    f"{prefix} needs {requirement.line}, but {package} {requirement.installed or '(none)'} is what "
                    f"{', '.join(others)} run with; serve them in separate processes (gymhost serve FOLDER for each)"
                )
            else:
                logger.warning(
                    "%s: %s is not met here (installed: %s)", folders[prefix], requirement.line, requirement.installed
                )
    return problems
