"""What one instance of hosted code may take (``Limits``: memory, processes, CPU time, the size of a file), and how
an instance that reaches a limit stops, saying which (``watch``).

The kernel enforces each, as an rlimit set where the instance begins (``_rules.fork_instance``): cgroup v2's
``memory.max`` and ``pids.max`` would need a cgroup delegated to the server, which neither these machines nor a
default pod give.

- memory: ``RLIMIT_DATA``, the instance's private writable memory (its heap and anonymous maps, counted from its
  fork: the template's pages it shares count too), not ``RLIMIT_AS``, which counts the address space numpy and JAX
  reserve and never use. Reached: an allocation fails, and Python raises ``MemoryError``.
- processes: ``RLIMIT_NPROC``, threads included, counted per user in each user namespace: an instance's own (its
  first process, its threads, and what it starts). Reached: a fork or a thread's start fails (``EAGAIN``).
- CPU time: ``RLIMIT_CPU``, seconds of CPU over the instance's life (an episode's, as instances are fresh for each):
  ``SIGXCPU`` at the limit, ``SIGKILL`` from the kernel ``_CPU_GRACE_S`` later if the instance is still running.
- file size: ``RLIMIT_FSIZE``, its scratch's size: ``SIGXFSZ``, and the write fails (``EFBIG``).

An instance must notice it reached one even when the code that met it goes on (FastMCP turns a tool's exception
into an error result for the model, its cause gone): signal handlers for the two signals, and for the two
exceptions ``sys.monitoring``'s RAISE event, which costs nothing until an exception is raised. Once one is reached,
the instance says which to the server (its channel's notice) and ends: its episode is masked with the limit's
``failure_kind``, never scored, and the pool replaces it.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["LIMIT_KINDS", "Limits", "Reached", "apply_limits", "watch"]

_CPU_GRACE_S: Final = 5  # past the soft limit, before the kernel kills an instance that did not stop
_PROBE: Final = "/nonexistent/gymhost-process-limit-probe"  # spawned only to see whether a process can be made
_FREE_TOOL_IDS: Final = (3, 4)  # sys.monitoring's ids that no debugger, coverage tool or profiler claims


@dataclass(frozen=True)
class Limits:
    """One instance's limits; None: no limit of that kind."""

    memory_bytes: int | None = None
    processes: int | None = None
    cpu_seconds: int | None = None
    file_bytes: int | None = None


@dataclass(frozen=True)
class Reached:
    """A limit an instance reached: ``limit`` names it (the metric's reason), ``failure_kind`` is its episode's."""

    limit: str
    failure_kind: str
    message: str


# Each limit's failure_kind: nemo-gym's own name where it has one (``provider_oom_killed``), else gymhost's,
# namespaced as nemo-gym asks of names it does not register.
LIMIT_KINDS: Final = {
    "memory": "provider_oom_killed",
    "processes": "sandbox:process_limit",
    "cpu_time": "sandbox:cpu_limit",
    "file_size": "sandbox:file_size_limit",
}


def apply_limits(limits: Limits) -> None:
    """Set the instance's rlimits (soft and hard alike: hosted code may lower them, never raise them)."""
    for kind, value in (
        (resource.RLIMIT_DATA, limits.memory_bytes),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
    ):
        if value is not None:
            resource.setrlimit(kind, (value, value))
    if limits.cpu_seconds is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + _CPU_GRACE_S))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no copy of its memory behind


def watch(limits: Limits, stop: Callable[[Reached], Any]) -> None:
    """From now on, ``stop`` is called (and must not return) as soon as this process reaches one of ``limits``."""
    said = {limit: Reached(limit, kind, _message(limit, limits)) for limit, kind in LIMIT_KINDS.items()}
    if limits.cpu_seconds is not None:
        signal.signal(signal.SIGXCPU, lambda *_: stop(said["cpu_time"]))
    if limits.file_bytes is not None:
        signal.signal(signal.SIGXFSZ, lambda *_: stop(said["file_size"]))
    if limits.memory_bytes is None and limits.processes is None:
        return

    probed: list[BaseException] = []  # the last exception probed for: RAISE comes again in each frame it leaves

    def raised(code: Any, offset: int, exception: BaseException) -> Any:
        if isinstance(exception, MemoryError) and limits.memory_bytes is not None:
            stop(said["memory"])
        elif limits.processes is not None and _no_process_could_start(exception) and exception not in probed:
            probed[:] = [exception]
            if not _can_start_a_process():
                stop(said["processes"])

    monitoring: Any = getattr(sys, "monitoring", None)
    if monitoring is None:  # before Python 3.12: signals only
        return
    for tool in _FREE_TOOL_IDS:
        try:
            monitoring.use_tool_id(tool, "gymhost limits")
        except ValueError:  # taken by something the environment runs
            continue
        monitoring.register_callback(tool, monitoring.events.RAISE, raised)
        monitoring.set_events(tool, monitoring.events.RAISE)
        return


def _no_process_could_start(exception: BaseException) -> bool:
    """What a fork or a thread's start raises when no process may be made (or a non-blocking read that would wait:
    ``_can_start_a_process`` tells them apart)."""
    if isinstance(exception, BlockingIOError):
        return exception.errno == errno.EAGAIN
    return isinstance(exception, RuntimeError) and "can't start new thread" in str(exception)


def _can_start_a_process() -> bool:
    """Whether a process can be made now: ``posix_spawn`` of a path that does not exist makes one (a vfork: no
    pages copied) that fails its exec, and is reaped by the C library; at the limit it cannot be made at all."""
    try:
        os.posix_spawn(_PROBE, [_PROBE], {})
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _message(limit: str, limits: Limits) -> str:
    what = {
        "memory": f"its memory limit ({_bytes(limits.memory_bytes)}, RLIMIT_DATA)",
        "processes": f"its limit of {limits.processes} processes and threads (RLIMIT_NPROC)",
        "cpu_time": f"its limit of {limits.cpu_seconds} s of CPU time (RLIMIT_CPU)",
        "file_size": f"its limit on a file's size ({_bytes(limits.file_bytes)}, RLIMIT_FSIZE)",
    }[limit]
    return f"the environment instance reached {what} and was stopped"


def _bytes(value: int | None) -> str:
    if value is None:
        return "none"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"
