"""Whether several resources-server folders can share one Python process.

Gym gives every server its own venv, built from its folder's ``requirements.txt``. A gateway puts several folders
in one process, and so in one set of installed packages: two folders that need different versions of the same
package cannot both have theirs. This compares each folder's requirements with what is installed, using
``packaging`` (the library pip uses for the same job).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = ["FolderRequirement", "conflicts", "requirements_of"]

logger = logging.getLogger("gymhost")

# The host itself: a folder's requirements name them, but they are what is running.
_HOST_PACKAGES = {"nemo-gym", "gymhost"}


@dataclass(frozen=True)
class FolderRequirement:
    package: str
    line: str
    installed: str | None
    met: bool


def requirements_of(folder: Path) -> Iterator[FolderRequirement]:
    """Each line of ``folder/requirements.txt`` that names a package, and whether this process satisfies it."""
    path = folder / "requirements.txt"
    for line in path.read_text().splitlines() if path.is_file() else []:
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):  # options, and Gym's `-e nemo-gym[dev] @ ../../`
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        package = canonicalize_name(requirement.name)
        if package in _HOST_PACKAGES or (requirement.marker is not None and not requirement.marker.evaluate()):
            continue
        try:
            installed: str | None = version(package)
        except PackageNotFoundError:
            installed = None
        met = installed is not None and (not requirement.specifier or installed in requirement.specifier)
        yield FolderRequirement(package, text, installed, met)


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
