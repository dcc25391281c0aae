"""A folder's own environment, as Gym's launcher gives every server one: a venv built from the folder's
``requirements.txt``, with this nemo-gym and this gymhost, built once and kept.

Gym builds each server a venv before it starts it; gymhost serves a folder in the environment it runs in, which
meets most folders' needs (their requirements are nemo-gym's). A folder whose ``requirements.txt`` this environment
does not meet (a package missing, another version installed: ``_requirements``) gets a venv of its own, on asking
(``gymhost serve --venv``): made with uv when uv is on ``PATH`` (as Gym makes them; it links packages from its cache,
so a venv costs seconds), else with ``venv`` and pip. The venv is named by what it is made from (the Python, the
nemo-gym and gymhost installed here, the folder's requirements), so a changed ``requirements.txt`` makes a new one
and an unchanged one is reused; a lock keeps two servers from building the same one at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from .._config import VENV_DIR_ENV_VAR, venv_root
from .._exceptions import ServeError
from .._terminal import redraws_in_place
from ._requirements import host_extras, requirement_lines, requirements_of

__all__ = ["folder_venv", "gymhost_dependency", "gymhost_requirement", "unmet_requirements"]

logger = logging.getLogger("gymhost")

_BUILT = ".gymhost-venv.json"  # written last: a venv without it is a build that did not finish
_SAY_EVERY_S = 10.0  # how often a build in progress says how it goes
_TAIL_BYTES = 4096  # where the installer's last line is looked for, back from its output's end


def unmet_requirements(folder: Path) -> list[str]:
    """The lines of the folder's ``requirements.txt`` this environment does not meet."""
    return [requirement.line for requirement in requirements_of(folder) if not requirement.met]


def gymhost_requirement(*, as_installed: bool = False) -> str:
    """gymhost as pip or uv can install it: from where this gymhost was installed (PEP 610's ``direct_url.json``: a
    checkout, a wheel file, a VCS URL), else the version from a package index. ``as_installed``: an editable install
    (a checkout being worked on) is installed editable again, so a folder's venv runs the same code."""
    try:
        distribution = importlib.metadata.distribution("gymhost")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "gymhost[nemo-gym]"
    direct = json.loads(distribution.read_text("direct_url.json") or "{}")
    url = direct.get("url")
    if isinstance(url, str) and url:
        if as_installed and (direct.get("dir_info") or {}).get("editable") and url.startswith("file://"):
            return f"-e {url.removeprefix('file://')}[nemo-gym]"
        return f"gymhost[nemo-gym] @ {url}"
    return f"gymhost[nemo-gym]=={distribution.version}"


def gymhost_dependency(name: str) -> str:
    """gymhost's own requirement on ``name``, as its installed metadata declares it (``pyproject.toml``'s), for a
    written folder's requirements.txt; ``name`` alone when gymhost is not installed."""
    try:
        requires = importlib.metadata.requires("gymhost") or []
    except importlib.metadata.PackageNotFoundError:
        return name
    wanted = name.lower().replace("_", "-")
    for line in requires:
        requirement = Requirement(line)
        if requirement.name.lower().replace("_", "-") == wanted and requirement.marker is None:
            return f"{requirement.name}{requirement.specifier}"
    return name


def folder_venv(folder: Path) -> Path:
    """The Python of the folder's own venv, built first if there is none yet."""
    requirements = _requirements(folder)
    key = hashlib.sha256("\n".join([sys.version, sys.executable, *requirements]).encode()).hexdigest()[:16]
    venvs = venv_root().absolute()  # the installer runs in the folder
    venv = venvs / f"{folder.name}-{key}"
    python = venv / "bin" / "python"

    def built() -> bool:
        done = (venv / _BUILT).is_file()
        if done:
            logger.info("%s: serving from its own venv %s", folder.name, venv)
        return done

    if built():  # maybe ahead, on a file system read-only now (an image's): nothing to lock
        return python
    try:
        venvs.mkdir(parents=True, exist_ok=True)
        lock = (venvs / f".{venv.name}.lock").open("w")
    except OSError as error:  # a read-only file system (a pod's), a full disk: no build here, and why
        raise ServeError(
            f"{folder.name}: its venv cannot be built in {venvs} ({error.strerror}): set {VENV_DIR_ENV_VAR} to a "
            "writable folder with room for it (up to 1.5 GB), or install what it needs in this environment "
            f"instead: gymhost requirements {folder} | pip install -r /dev/stdin"
        ) from error
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build of a venv at a time; released as the file closes
        if built():  # by another server, while this one waited
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a build that did not finish
        began = time.monotonic()
        log = venvs / f".{venv.name}.log"
        logger.warning(
            "%s: its requirements.txt is not met here (%s): building it a venv of its own in %s, with %s; the "
            "installer's output goes to %s",
            folder.name,
            ", ".join(unmet_requirements(folder)) or "its own",
            venv,
            "uv" if shutil.which("uv") else "pip (put uv on PATH for a faster build)",
            log,
        )
        try:
            _build(venv, requirements, _Installer(folder.name, log, folder))
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / _BUILT).write_text(json.dumps({"requirements": requirements, "python": sys.version}, indent=2))
        logger.warning("%s: its venv was built in %.0fs", folder.name, time.monotonic() - began)
    return python


def _requirements(folder: Path) -> list[str]:
    """What the venv installs: this nemo-gym (with the extras the folder's line asks for: Gym's requirements.txt
    names nemo-gym by its checkout, ``-e nemo-gym[dev] @ ../../``, and here it is the one installed), this gymhost,
    and the folder's other requirements, as its ``requirements.txt`` writes them (paths in them are the folder's:
    the installer runs there, as Gym's does)."""
    nemo_gym = importlib.metadata.version("nemo-gym")
    extras = ""
    lines = []
    for line in requirement_lines(folder / "requirements.txt"):  # as pip reads them: the files -r names inlined
        asked = host_extras(line)
        if asked is not None:
            extras = asked or extras
        elif not re.match(r"^gymhost\b", line):
            lines.append(line)
    return [f"nemo-gym{extras}=={nemo_gym}", gymhost_requirement(as_installed=True), *lines]


def _build(venv: Path, requirements: list[str], installer: _Installer) -> None:
    listed = venv.parent / f".{venv.name}.requirements.txt"
    listed.write_text("\n".join(requirements) + "\n")
    uv = shutil.which("uv")
    python = venv / "bin" / "python"
    target = _python_version_for_nemo_gym()
    try:
        if uv is not None:
            installer.run([uv, "venv", "--python", sys.executable, str(venv)], "creating the venv")
            command = [uv, "pip", "install", "--python", str(python), "-r", str(listed)]
            if target is not None:  # nemo-gym's Requires-Python is newer than this Python: resolve as if it were
                command += ["--python-version", target]
        else:
            installer.run([sys.executable, "-m", "venv", str(venv)], "creating the venv")
            command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(listed)]
            if target is not None:
                command.append("--ignore-requires-python")
        installer.run(command, "installing its requirements")
    except ServeError:
        raise  # the requirements file stays, for the command the error says to run again
    except BaseException:
        listed.unlink(missing_ok=True)
        raise
    listed.unlink(missing_ok=True)


class _Installer:
    """Runs the installer's commands with their output in ``log``, and says how the build goes while it runs (a
    build takes minutes): on a terminal, a status line redrawn in place; otherwise a log line every
    ``_SAY_EVERY_S``; either with the time so far and the installer's last line. A failure says the output's end,
    where the rest is, and the command to run it again."""

    def __init__(self, name: str, log: Path, folder: Path) -> None:
        self.name, self.log, self.folder = name, log, folder
        log.write_text("")

    def run(self, command: list[str], what: str) -> None:
        began = time.monotonic()
        with self.log.open("a") as output, self._shown() as (say, every):
            output.write(f"$ {shlex.join(command)}\n")
            output.flush()
            start = output.tell()
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.folder
            )
            while True:
                try:
                    status = process.wait(every)
                    break
                except subprocess.TimeoutExpired:
                    say(f"{self.name}: building its venv, {what}: {time.monotonic() - began:.0f}s so far; the "
                        f"installer's last line: {self._last_line()}")  # fmt: skip
                except BaseException:
                    process.kill()
                    process.wait()
                    raise
        if status != 0:
            tail = self._output(start)[-8:]
            raise ServeError(
                f"building a folder's venv failed ({what}): {' | '.join(tail)}; the installer's whole output is in "
                f"{self.log}; to run it again: cd {shlex.quote(str(self.folder))} && {shlex.join(command)}"
            )

    @contextlib.contextmanager
    def _shown(self) -> Iterator[tuple[Callable[[str], None], float]]:
        """How the build's progress is said, and how often."""
        if not redraws_in_place(sys.stderr):
            yield (lambda line: logger.warning("%s", line)), _SAY_EVERY_S
            return
        from rich.console import Console
        from rich.text import Text

        with Console(stderr=True).status(f"{self.name}: building its venv") as status:
            yield (lambda line: status.update(Text(line[: status.console.width - 4]))), 0.5

    def _output(self, start: int = 0) -> list[str]:
        with self.log.open(errors="replace") as output:
            output.seek(start)
            return [line.rstrip() for line in output.read().splitlines() if line.strip()]

    def _last_line(self) -> str:
        """The output's last line, read from its end: asked every half second of a build that can log thousands."""
        with self.log.open("rb") as output:
            output.seek(max(0, output.seek(0, 2) - _TAIL_BYTES))
            lines = [line for line in output.read().decode(errors="replace").splitlines() if line.strip()]
        return lines[-1].rstrip()[:200] if lines else "(nothing yet)"


def _python_version_for_nemo_gym() -> str | None:
    """The oldest Python nemo-gym says it needs, when this one is older (nemo-gym 0.5+ says 3.13.14; gymhost is
    tested on 3.13.0, where it runs): what the installer is told to resolve for, as gymhost's own venvs were made
    with ``--ignore-requires-python``."""
    declared = importlib.metadata.metadata("nemo-gym").get("Requires-Python")
    try:
        specifier = SpecifierSet(declared or "")
    except InvalidSpecifier:
        return None
    here = ".".join(str(part) for part in sys.version_info[:3])
    if specifier.contains(here, prereleases=True):
        return None
    floors = [spec.version for spec in specifier if spec.operator in (">=", "==", "~=")]
    return floors[0] if floors else None
