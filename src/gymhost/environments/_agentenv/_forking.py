"""Process-mode instances: one process per instance, forked from a template that imported the environment once.

``BundleLauncher`` starts the template (``_template``) on first use and asks it for an instance per launch; each
instance answers on a Unix socket of its own in a private folder (``_channel``), so no port is picked and nobody else
on the machine can reach it. Instances are not this process's children (the template's), so they are watched through a
pidfd, which the template opens and hands over on a socket (``SCM_RIGHTS``): the pool hears of an exit as it
happens, signals go to the very process that was started, never to a recycled pid, and a pid the template sees in
a PID namespace of its own never has to mean anything here. When the environment cannot be forked (its import
started threads), each instance is started as a process of its own (``--serve``), watched as an ordinary child.

Both are processes of hosted code, started through the server's confinement (``gymhost._confinement``): its
command, its rules (``--confine``: what the process does to itself, the template before it imports the bundle and
each instance where it begins), and the one folder they write to, the instances' sockets.

``gymhost serve`` may start a written folder's template before it builds its app (``start_early``), so that the
template imports the bundle on one core while the server imports nemo-gym on the other; the pool's launcher adopts
it on first use if it was started as the launcher would start it, and stops it otherwise (``_Early``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ... import _hosted_output as hosted_output
from ..._config import DEFAULT_SANDBOX, configured_sandbox
from ..._confinement import Confinement, Limits, Rules, confinement, hosted_environment, scratch_of
from ..._descriptors import received_fds
from ..._scratch import remove, scratch_folder
from .._backend import Instance
from .._errors import StartupError
from .._outcomes import Failure
from .._settings import DEFAULT_CONSTRUCT_ONCE, PoolSettings
from ._channel import ChannelClient, Copies

__all__ = [
    "CONFINE",
    "CONSTRUCT_EACH",
    "PIDFDS",
    "SERVE",
    "SERVER_PID",
    "SPAWNED",
    "TEMPLATE_READY",
    "BundleLauncher",
    "stop_early",
]

logger = logging.getLogger("gymhost.environments")

# The template's protocol (``_template``): it says TEMPLATE_READY fork|nofork, then answers each spawn with SPAWNED PID.
TEMPLATE_READY = "gymhost-template"
SPAWNED = "spawned"
CONSTRUCT_EACH = "--construct-each"  # the template's option: each instance constructs its environment after its fork
CONFINE = "--confine"  # the template's and an instance's option: the rules it confines itself by (``_confinement``)
PIDFDS = "--pidfds"  # the template's option: the socket it hands each instance's pidfd over
SERVE = "--serve"  # the template's option: no template, one instance answering on this socket path
SERVER_PID = "GYMHOST_TEMPLATE_SERVER_PID"  # the process the template dies with (set in the template's environment)
_STOP_GRACE_S = 5.0
_END_OF_INPUT_GRACE_S = 2.0  # a template reads its input between spawns: it exits at once, unless stuck importing
_TEMPLATE = ("-m", "gymhost.environments._agentenv._template")


class ForkedProcess:
    """An instance the template forked: watched and signalled through a pidfd."""

    def __init__(self, pidfd: int | None, pid: int) -> None:
        """``pidfd`` None: the instance was gone before the template could open one; ``pid`` as the template sees
        it, for messages when this process's own view of it cannot be read."""
        self._pidfd = pidfd
        self.pid = _pid_of(pidfd) or pid
        self._exit: asyncio.Future[None] | None = None

    def exited_now(self) -> bool:
        if self._pidfd is None or (self._exit is not None and self._exit.done()):
            return True
        return bool(select.select([self._pidfd], [], [], 0)[0])

    async def wait(self) -> None:
        await asyncio.shield(self._exited())

    def kill(self) -> None:
        """SIGKILL; its exit (its memory freed, its namespaces torn down) at idle priority: the seeds and calls of
        other episodes first, as an episode's end is when a fresh instance's replaces it."""
        if self._pidfd is not None and not self.exited_now():
            with contextlib.suppress(OSError):
                os.sched_setscheduler(self.pid, os.SCHED_IDLE, os.sched_param(0))
        self._signal(signal.SIGKILL)

    def pause(self) -> bool:
        if self.exited_now():
            return False
        self._signal(signal.SIGSTOP)  # the first process of its PID namespace: signalled from outside, it stops
        return True

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

    def pause(self) -> bool:
        """Never: confined, this is the instance's keeper (``enter_instance``), and stopping it would not stop the
        instance."""
        return False

    async def terminate(self) -> None:
        await _terminate(self.process)


class _Process(Protocol):
    """What the launcher uses of a template's process: asyncio's, or one started before its loop (``_Adopted``)."""

    pid: int
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, signum: int) -> None: ...
    def kill(self) -> None: ...


class _Adopted:
    """A process ``subprocess.Popen`` started before this event loop existed (``_Early``), with the surface of
    asyncio's: its standard input and output (one socket, ``channel``) as streams of this loop, its exit heard
    through a pidfd (and reaped here). A socket rather than pipes: a loop owns a socket it is handed outright
    (uvloop detaches it), where a pipe's file object would be closed once by the loop and once more by itself."""

    def __init__(
        self, popen: subprocess.Popen[bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin: asyncio.StreamWriter | None = writer
        self.stdout: asyncio.StreamReader | None = reader

    @classmethod
    async def of(cls, popen: subprocess.Popen[bytes], channel: socket.socket) -> _Adopted:
        reader, writer = await asyncio.open_unix_connection(sock=channel)
        return cls(popen, reader, writer)

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        if self._popen.poll() is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except ProcessLookupError:  # exited and reaped meanwhile
                pidfd = None
            if pidfd is not None:
                loop = asyncio.get_running_loop()
                exited: asyncio.Future[None] = loop.create_future()

                def on_exit() -> None:
                    if not exited.done():
                        exited.set_result(None)

                loop.add_reader(pidfd, on_exit)
                try:
                    await exited
                finally:
                    loop.remove_reader(pidfd)
                    os.close(pidfd)
        status = self._popen.wait()
        if self.stdin is not None:
            self.stdin.close()  # its channel: nobody speaks on it any more
        return status

    def send_signal(self, signum: int) -> None:
        self._popen.send_signal(signum)

    def kill(self) -> None:
        self._popen.kill()


class _Template:
    """The template process and the protocol on its pipes; one spawn at a time (a fork takes milliseconds)."""

    def __init__(self, process: _Process, forks: bool, pidfds: socket.socket) -> None:
        self.process = process
        self.forks = forks
        self.copies = Copies()  # what its forks share, when they are copies of one constructed environment
        self._pidfds = pidfds
        self._lock = asyncio.Lock()

    @classmethod
    async def start(
        cls, start: _Start, timeout: float, *, construct_once: bool, early: _Early | None = None
    ) -> _Template:
        """Started now, or ``early`` adopted (started as this would start it); ready once it says so."""
        if early is not None:
            pidfds = early.pidfds
            try:
                process: _Process = await _Adopted.of(early.popen, early.channel)
                output = await start.relay(early.output)
            except BaseException:  # cancelled as the server stops, say: nothing of it may be left
                early.stop()
                raise
        else:
            pidfds, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                arguments = _template_arguments(construct_once, theirs)
                pipe = asyncio.subprocess.PIPE
                process, output = await start.process(arguments, stdout=pipe, pass_fds=(theirs.fileno(),))
            except BaseException:
                pidfds.close()
                raise
            finally:
                theirs.close()
        pidfds.setblocking(False)
        bundle = start.bundle
        try:
            # Importing, then constructing twice (in a throwaway child, then for good): more than one start's limit.
            words = await _line(process, timeout * (3 if construct_once else 1))
        except BaseException:
            pidfds.close()
            await _terminate(process)
            raise
        if words[:1] != [TEMPLATE_READY] or len(words) != 2:
            pidfds.close()
            await _terminate(process)
            await output.said()  # what it printed as it failed, whatever the log's level
            raise StartupError(
                f"{bundle}/env.py: the instance template exited with status {process.returncode} before serving; "
                f"it said:\n{output.last_lines()}"
            )
        forks = words[1] == "fork"
        if not forks:  # it exits as it says so: reaped now, not left a zombie for the server's life
            await _terminate(process)
        return cls(process, forks=forks, pidfds=pidfds)

    def alive(self) -> bool:
        return self.process.returncode is None

    async def spawn(self, path: Path, timeout: float) -> ForkedProcess:
        async with self._lock:
            assert self.process.stdin is not None
            self.process.stdin.write(f"spawn {path}\n".encode())
            await self.process.stdin.drain()
            words = await _line(self.process, timeout)
            if len(words) != 2 or words[0] != SPAWNED:
                raise StartupError(f"the instance template answered {' '.join(words)!r}, not a new instance")
            try:  # sent before the line above: waiting in the socket already
                _, pidfds, _ = received_fds(self._pidfds, 1, 1)  # not for what the server starts
            except BlockingIOError:
                raise StartupError("the instance template spawned an instance and handed over no pidfd") from None
        # The template runs hosted code: what it hands over is used only if it is a pidfd, of a process it started
        # (the server signals it, and may make it wait: never the server itself, nor another of its user's).
        pidfd = pidfds[0] if pidfds else None
        if pidfd is not None and not os.readlink(f"/proc/self/fd/{pidfd}").startswith(("anon_inode:[pidfd]", "pidfd:")):
            os.close(pidfd)
            raise StartupError("the instance template handed over something that is not a pidfd")
        pid = _pid_of(pidfd)  # None: no pidfd (the instance was gone), or gone since: nothing is signalled then
        if pidfd is not None and pid is not None and not _descends_from(pid, self.process.pid):
            os.close(pidfd)
            raise StartupError(f"the instance template handed over process {pid}, which it did not start")
        return ForkedProcess(pidfd, int(words[1]) if words[1].isdigit() else 0)

    async def stop(self) -> None:
        self._pidfds.close()
        await _terminate(self.process)


class _Start:
    """How a bundle's hosted processes (its template, or an instance on its own) start: its Python module, run
    through the server's confinement, with an environment of its own."""

    def __init__(
        self, bundle: Path, confinement: Confinement, limits: Limits, network: bool, unreadable: tuple[Path, ...]
    ) -> None:
        self.bundle = bundle
        self.confinement = confinement
        self.network = network
        self.unreadable = unreadable
        self.folder = scratch_folder("instances")
        self.sockets = confinement.hand_over(self.folder)
        self.rules: Rules | None = confinement.rules(
            hidden=[self.sockets], limits=limits, network=network, readable=[bundle], unreadable=unreadable
        )

    async def process(
        self, arguments: list[str], **options: object
    ) -> tuple[asyncio.subprocess.Process, hosted_output.HostedOutput]:
        """Started, what it prints logged as hosted code's (``_hosted_output``)."""
        command, env = self._command(arguments)
        ours, theirs = hosted_output.pair()
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,  # closed (or the server dies): the process goes, and the instances too
                stderr=theirs.fileno(),
                env=env,
                **options,  # type: ignore[arg-type]
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            return process, await self.relay(ours)
        except BaseException:  # cancelled, say: a process nobody holds is stopped, not left to its stdin's end
            ours.close()
            with contextlib.suppress(ProcessLookupError):  # gone already
                process.kill()
            raise

    def popen(
        self, arguments: list[str], channel: socket.socket, output: socket.socket, **options: object
    ) -> subprocess.Popen[bytes]:
        """``process``, before there is an event loop (``_Early``), its standard input and output ``channel``, what
        it prints on ``output`` (``relay`` it once there is a loop)."""
        command, env = self._command(arguments)
        return subprocess.Popen(command, stdin=channel, stdout=channel, stderr=output, env=env, **options)  # type: ignore[call-overload,no-any-return]

    async def relay(self, ours: socket.socket) -> hosted_output.HostedOutput:
        """What the process prints on the other end of ``ours``, logged as the written folder's hosted code's."""
        # A written folder's bundle is its folder's ``bundle``: the folder names it; a bundle elsewhere, itself.
        name = self.bundle.parent.name if self.bundle.name == "bundle" else self.bundle.name
        return await hosted_output.relay(ours, name)

    def _command(self, arguments: list[str]) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, *_TEMPLATE, str(self.bundle), *arguments]
        if self.rules is not None:
            argv += [CONFINE, self.rules.to_argument()]
        # A process the sandbox tool started dies with it, and it with the server; one started directly is told
        # which process to die with (``_template._die_with_server``): the pid means nothing in a namespace.
        sandboxed = self.rules is not None and self.rules.namespaces
        told = {} if sandboxed else {SERVER_PID: str(os.getpid())}
        command = self.confinement.command(
            argv, readable=[self.bundle], writable=[self.sockets], network=self.network, unreadable=self.unreadable
        )
        return command, hosted_environment(**self.confinement.environment(), **told)  # never the server's own


@dataclass(frozen=True)
class _Key:
    """What a template's start depends on: a template started early is adopted only by a launcher with the same."""

    bundle: Path
    construct_once: bool
    confinement: Confinement
    limits: Limits
    network: bool
    unreadable: tuple[Path, ...]
    cwd: str


@dataclass
class _Early:
    """A template started before the server's event loop (``BundleLauncher.start_early``), until a launcher adopts it
    or the server stops it (``stop_early``): its process, the socket that is its standard input and output, the one
    it hands instances' pidfds over, and the one it prints on (relayed once adopted; till then the socket holds it)."""

    key: _Key
    start: _Start
    popen: subprocess.Popen[bytes]
    channel: socket.socket
    pidfds: socket.socket
    output: socket.socket

    def stop(self) -> None:
        """As ``_terminate``: the end of its input (it exits when it reads it, once it has imported the bundle), then
        SIGTERM, then SIGKILL. Never a signal first: bubblewrap killed while it sets the sandbox up leaves the
        sandbox's first process behind, orphaned, for good. Its folder removed whatever happens."""
        try:
            self.channel.close()
            self.pidfds.close()
            self.output.close()  # what it printed and no launcher relayed is lost with it
            try:
                self.popen.wait(_END_OF_INPUT_GRACE_S)
            except subprocess.TimeoutExpired:
                self.popen.terminate()
                try:
                    self.popen.wait(_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
        finally:
            remove(self.start.folder)


_early: _Early | None = None  # at most one: only a server of one written folder starts its template early


def stop_early() -> None:
    """Stop the template started early that no launcher adopted (the app failed to build, or was built otherwise)."""
    global _early
    early, _early = _early, None
    if early is not None:
        early.stop()


class BundleLauncher:
    """One process per instance, forked from a template (``_template``) that imported the bundle's environment once."""

    owns_instances = True

    def __init__(
        self,
        bundle: Path,
        *,
        construct_once: bool = DEFAULT_CONSTRUCT_ONCE,
        confinement: Confinement | None = None,
        limits: Limits | None = None,
        network: bool = False,
        fresh: bool = True,
        unreadable: tuple[Path, ...] = (),
    ) -> None:
        """``confinement``: the level its processes run at; by default the one ``GYMHOST_SANDBOX`` (else ``auto``)
        gives. Confined, each instance takes at most ``limits`` and reaches the network only if ``network``.
        ``fresh``: each instance serves one episode, and the next gets a fresh fork (nothing one leaves behind, in
        its scratch or its memory, reaches another). ``unreadable``: what its hosted code may not read even where
        the bundle or the root's read-only view would show it (the served folder, the bundle's tasks)."""
        self.bundle = bundle
        self.unreadable = unreadable
        self.construct_once = construct_once
        self.confinement = confinement if confinement is not None else default_confinement()
        self.limits = limits if limits is not None else Limits()
        self.network = network
        self.fresh = fresh
        self.description = f"bundle {bundle}"
        self.confinement_level: str = self.confinement.level
        self._template: _Template | None = None
        self._starting = asyncio.Lock()
        self._start: _Start | None = None

    def start_early(self, cwd: Path) -> None:
        """Start the template now, before the server's event loop, for the launcher the app will make to adopt
        (``_Early``); ``cwd``: the folder the server will be in by then, which the template starts in."""
        global _early
        stop_early()
        start = self._new_start()
        pidfds, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel, its_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        output, its_output = hosted_output.pair()
        key = self._key(cwd.resolve())
        try:
            arguments = _template_arguments(self.construct_once, theirs)
            popen = start.popen(arguments, its_channel, its_output, pass_fds=(theirs.fileno(),), cwd=cwd)
            _early = _Early(key, start, popen, channel, pidfds, output)  # at once: a signal now still finds it to stop
        except BaseException:
            pidfds.close()
            channel.close()
            output.close()
            remove(start.folder)
            raise
        finally:
            theirs.close()
            its_channel.close()
            its_output.close()
        logger.debug("%s: instance template started before the server is built (pid %d)", self.bundle, popen.pid)

    def _key(self, cwd: Path | None = None) -> _Key:
        where = str(cwd if cwd is not None else Path.cwd())
        return _Key(
            self.bundle, self.construct_once, self.confinement, self.limits, self.network, self.unreadable, where
        )

    def _new_start(self) -> _Start:
        return _Start(self.bundle, self.confinement, self.limits, self.network, self.unreadable)

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        template = await self._template_up(settings.startup_timeout_s)
        assert self._start is not None
        path = self._start.sockets / f"{index}.sock"
        if template.forks:
            process: ForkedProcess | SpawnedProcess = await template.spawn(path, settings.startup_timeout_s)
        else:  # stdin never written: closed when this process goes, and so it goes
            process = SpawnedProcess((await self._start.process([SERVE, str(path)]))[0])
        copies = template.copies if template.forks and self.construct_once else None
        client = ChannelClient(
            str(path), base_url=f"http://instance-{index}", data_timeout=settings.data_timeout_s, copies=copies
        )
        return Instance(index, client, process=process, one_episode=self.fresh)

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()
        if instance.process is not None:
            if not graceful:
                instance.process.kill()
            await instance.process.terminate()
        if self._start is not None:  # its scratch, where one was made beside its channel (``landlock``)
            scratch = scratch_of(str(self._start.sockets / f"{instance.index}.sock"))
            if os.path.lexists(scratch):
                await asyncio.to_thread(remove, scratch)

    async def exited(self, instance: Instance) -> Failure | None:
        assert instance.process is not None
        assert isinstance(instance.client, ChannelClient)
        await instance.process.wait()
        reached = await instance.client.ended()
        return Failure(reached.kind, str(reached)) if reached is not None else None

    async def close(self) -> None:
        template, self._template = self._template, None
        if template is not None:
            await template.stop()
        if self._start is not None:
            remove(self._start.folder)
            self._start = None

    async def _template_up(self, timeout: float) -> _Template:
        """The template, started on first use and again if it died (its instances died with it); one that said it
        cannot fork has exited on purpose, and is not started again for every instance."""
        async with self._starting:
            if self._template is None or (self._template.forks and not self._template.alive()):
                if self._template is not None:  # one that died: its pipes and socket closed, its process reaped
                    await self._template.stop()
                early = await self._adopt_early() if self._start is None else None
                if early is not None:
                    self._start = early.start
                elif self._start is None:
                    self._start = self._new_start()
                try:
                    self._template = await _Template.start(
                        self._start, timeout, construct_once=self.construct_once, early=early
                    )
                except BaseException:
                    if early is not None:  # stopped, its folder with it: the next start makes its own
                        self._start = None
                    raise
            return self._template

    async def _adopt_early(self) -> _Early | None:
        """The template started early, if it was started as this launcher would start its own; else None, and one
        started otherwise is stopped (in a thread: it may take the grace period to go)."""
        global _early
        early, _early = _early, None
        if early is None:
            return None
        if early.key == self._key():
            logger.debug("%s: the instance template started early adopted (pid %d)", self.bundle, early.popen.pid)
            return early
        logger.info("the instance template started early is not this pool's (%s); starting another", self.bundle)
        await asyncio.to_thread(early.stop)
        return None


def default_confinement() -> Confinement:
    """The confinement ``GYMHOST_SANDBOX`` asks for, else ``auto``'s."""
    return confinement(configured_sandbox() or DEFAULT_SANDBOX)


def _pid_of(pidfd: int | None) -> int | None:
    """The process's pid as this process sees it (``/proc/self/fdinfo``), or None: exited, or no pidfd."""
    if pidfd is None:
        return None
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as info:
            for line in info:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


def _descends_from(pid: int, ancestor: int, levels: int = 4) -> bool:
    """Whether ``ancestor`` is ``pid``'s parent, or its parent's, within ``levels`` (a confined template is the
    grandchild of what the server started: bubblewrap, and the sandbox's first process)."""
    for _level in range(levels):
        try:
            with open(f"/proc/{pid}/status") as status:
                pid = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
        except (OSError, StopIteration, ValueError):
            return False
        if pid == ancestor:
            return True
    return False


def _template_arguments(construct_once: bool, pidfds: socket.socket) -> list[str]:
    return [*([] if construct_once else [CONSTRUCT_EACH]), PIDFDS, str(pidfds.fileno())]


async def _line(process: _Process, timeout: float) -> list[str]:
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), timeout)
    except TimeoutError:
        raise StartupError(f"the instance template did not answer within {timeout:g}s") from None
    return line.decode(errors="replace").split()


async def _terminate(process: _Process | asyncio.subprocess.Process) -> None:
    """The end of its input first: a template exits there, and its instances with it, each process reaped by its
    parent on the way out (the sandbox's among them, which SIGTERM would kill before the processes under it);
    SIGTERM if it has not gone meanwhile, SIGKILL past the grace period."""
    if process.stdin is not None:
        process.stdin.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), _END_OF_INPUT_GRACE_S)
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
