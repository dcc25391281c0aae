"""Process-mode instances: one process per instance, forked from a template that imported the environment once.

``BundleLauncher`` starts the template (``_template``) on first use and asks it for an instance per launch; each
instance answers on a Unix socket of its own in a private folder (``_channel``), so no port is picked and nobody else
on the machine can reach it. Instances are not this process's children (the template's), so they are watched through a
pidfd: the pool hears of an exit as it happens, and signals go to the very process that was started, never to a
recycled pid. When the environment cannot be forked (its import started threads), each instance is started as a
process of its own (``--serve``), watched as an ordinary child."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import sys
from pathlib import Path

from ..._confinement import hosted_environment
from ..._scratch import remove, scratch_folder
from .._backend import Instance
from .._errors import StartupError
from .._settings import DEFAULT_CONSTRUCT_ONCE, PoolSettings
from ._channel import ChannelClient

__all__ = ["CONSTRUCT_EACH", "SERVER_PID", "SPAWNED", "TEMPLATE_READY", "BundleLauncher"]

# The template's protocol (``_template``): it says TEMPLATE_READY fork|nofork, then answers each spawn with SPAWNED PID.
TEMPLATE_READY = "gymhost-template"
SPAWNED = "spawned"
CONSTRUCT_EACH = "--construct-each"  # the template's option: each instance constructs its environment after its fork
SERVER_PID = "GYMHOST_TEMPLATE_SERVER_PID"  # the process the template dies with (set in the template's environment)
_STOP_GRACE_S = 5.0
_TEMPLATE = ("-m", "gymhost.environments._agentenv._template")


class ForkedProcess:
    """An instance the template forked: watched and signalled through a pidfd."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            self._pidfd = None
        self._exit: asyncio.Future[None] | None = None

    def exited_now(self) -> bool:
        if self._pidfd is None or (self._exit is not None and self._exit.done()):
            return True
        return bool(select.select([self._pidfd], [], [], 0)[0])

    async def wait(self) -> None:
        await asyncio.shield(self._exited())

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    async def terminate(self) -> None:
        """SIGTERM (the instance's server shuts down cleanly), SIGKILL after a grace period; then forget the pidfd."""
        if not self.exited_now():
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.wait(), _STOP_GRACE_S)
            except TimeoutError:
                self.kill()
        await self.wait()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _exited(self) -> asyncio.Future[None]:
        """One future for everyone waiting: the event loop watches a file descriptor for one reader only."""
        if self._exit is None:
            loop = asyncio.get_running_loop()
            self._exit = exit_ = loop.create_future()
            pidfd = self._pidfd
            if pidfd is None:
                exit_.set_result(None)
            else:

                def on_exit() -> None:
                    loop.remove_reader(pidfd)
                    if not exit_.done():
                        exit_.set_result(None)

                loop.add_reader(pidfd, on_exit)
        return self._exit

    def _signal(self, signum: int) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)


class SpawnedProcess:
    """An instance started as a process of its own (``--serve``): a child of this process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pid = process.pid

    def exited_now(self) -> bool:
        return self.process.returncode is not None

    async def wait(self) -> None:
        await self.process.wait()

    def kill(self) -> None:
        """No await, so it also works in a task that is being cancelled; asyncio reaps what exits."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        if self.process.stdin is not None:
            self.process.stdin.close()

    async def terminate(self) -> None:
        await _terminate(self.process)


class _Template:
    """The template process and the protocol on its pipes; one spawn at a time (a fork takes milliseconds)."""

    def __init__(self, process: asyncio.subprocess.Process, forks: bool) -> None:
        self.process = process
        self.forks = forks
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, bundle: Path, timeout: float, *, construct_once: bool) -> _Template:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *_TEMPLATE,
            str(bundle),
            *([] if construct_once else [CONSTRUCT_EACH]),
            stdin=asyncio.subprocess.PIPE,  # commands; closed (or the server dies): the template and its instances go
            stdout=asyncio.subprocess.PIPE,
            env=hosted_environment(**{SERVER_PID: str(os.getpid())}),  # never the server's own
        )
        try:
            # Importing, then constructing twice (in a throwaway child, then for good): more than one start's limit.
            words = await _line(process, timeout * (3 if construct_once else 1))
        except BaseException:
            await _terminate(process)
            raise
        if words[:1] != [TEMPLATE_READY] or len(words) != 2:
            await _terminate(process)
            raise StartupError(
                f"{bundle}/env.py: the instance template exited with status {process.returncode} before serving "
                "(its error output is above)"
            )
        return cls(process, forks=words[1] == "fork")

    def alive(self) -> bool:
        return self.process.returncode is None

    async def spawn(self, path: Path, timeout: float) -> int:
        async with self._lock:
            assert self.process.stdin is not None
            self.process.stdin.write(f"spawn {path}\n".encode())
            await self.process.stdin.drain()
            words = await _line(self.process, timeout)
        if len(words) != 2 or words[0] != SPAWNED:
            raise StartupError(f"the instance template answered {' '.join(words)!r}, not a new instance")
        return int(words[1])

    async def stop(self) -> None:
        await _terminate(self.process)


class BundleLauncher:
    """One process per instance, forked from a template (``_template``) that imported the bundle's environment once."""

    owns_instances = True

    def __init__(self, bundle: Path, *, construct_once: bool = DEFAULT_CONSTRUCT_ONCE) -> None:
        self.bundle = bundle
        self.construct_once = construct_once
        self.description = f"bundle {bundle}"
        self._template: _Template | None = None
        self._starting = asyncio.Lock()
        self._sockets: Path | None = None

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        template = await self._template_up(settings.startup_timeout_s)
        assert self._sockets is not None
        path = self._sockets / f"{index}.sock"
        if template.forks:
            pid = await template.spawn(path, settings.startup_timeout_s)
            process: ForkedProcess | SpawnedProcess = ForkedProcess(pid)
        else:
            process = SpawnedProcess(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    *_TEMPLATE,
                    str(self.bundle),
                    "--serve",
                    str(path),
                    stdin=asyncio.subprocess.PIPE,  # never written: closed when this process goes, and so it goes
                    env=hosted_environment(),
                )
            )
        client = ChannelClient(str(path), base_url=f"http://instance-{index}", data_timeout=settings.data_timeout_s)
        return Instance(index, client, process=process)

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()
        if instance.process is not None:
            if not graceful:
                instance.process.kill()
            await instance.process.terminate()

    async def exited(self, instance: Instance) -> None:
        assert instance.process is not None
        await instance.process.wait()

    async def close(self) -> None:
        template, self._template = self._template, None
        if template is not None:
            await template.stop()
        if self._sockets is not None:
            remove(self._sockets)
            self._sockets = None

    async def _template_up(self, timeout: float) -> _Template:
        """The template, started on first use and again if it died (its instances died with it); one that said it
        cannot fork has exited on purpose, and is not started again for every instance."""
        async with self._starting:
            if self._template is None or (self._template.forks and not self._template.alive()):
                if self._sockets is None:
                    self._sockets = scratch_folder("instances")
                self._template = await _Template.start(self.bundle, timeout, construct_once=self.construct_once)
            return self._template


async def _line(process: asyncio.subprocess.Process, timeout: float) -> list[str]:
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), timeout)
    except TimeoutError:
        raise StartupError(f"the instance template did not answer within {timeout:g}s") from None
    return line.decode(errors="replace").split()


async def _terminate(process: asyncio.subprocess.Process) -> None:
    if process.stdin is not None:
        process.stdin.close()  # a template exits at the end of its input, and its instances with it
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
