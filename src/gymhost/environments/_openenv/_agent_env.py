"""agent-env bundles (PyPI ``agentenv-framework``'s format) as sources: agent-env's own OpenEnv server, run for the
bundle in agent-env's venv, on a private socket, and played as any OpenEnv server is.

An agent-env bundle is a folder of ``tasks/<name>.json`` step lists (with ``evals/<name>.toml``, ``envs/``,
``artifacts/``, ...); it is not gymhost's own bundle format (an agentenv-protocol ``env.py`` with gymhost task files,
``_agentenv``). agent-env serves one as an OpenEnv environment (``agent_env.openenv.build_app``: a split ``all`` and a
split per eval, each episode a run of a task whose outside agent the model plays), and that server is what a written
folder plays: ``AgentEnvFrameworkApp`` runs it for as long as the server lives (``_agent_env_app.py``, with the
interpreter the config names, since agent-env's dependencies conflict with nemo-gym's), on a Unix socket in a folder
of its own that also holds agent-env's stores and local sandboxes, removed when it stops; ``AgentEnvFrameworkLauncher``
hands the pool sessions on it. gymhost never imports ``agent_env`` or ``openenv``.

The names say which "agent env" they mean: ``AgentEnvFramework...`` is agent-env (the ``agentenv-framework``
package), ``_agentenv`` is the agentenv protocol, and the server in front of either is ``WrittenResourcesServer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from ..._config import AGENT_ENV_PYTHON_ENV_VAR, PARENT_PID_ENV_VAR, configured_agent_env_python
from ..._confinement import hosted_environment
from ..._hosted_output import HostedOutput, pair, relay
from ..._scratch import remove, scratch_folder
from .._backend import Instance, forever
from .._errors import SourceError, StartupError
from .._settings import PoolSettings
from ._client import OpenEnvClient, OpenEnvLauncher
from ._task_api import TaskApi

__all__ = [
    "AgentEnvFrameworkApp",
    "AgentEnvFrameworkLauncher",
    "agent_env_python",
    "is_agent_env_bundle",
    "running_app",
]

logger = logging.getLogger("gymhost.environments")

_RUNNER = Path(__file__).with_name("_agent_env_app.py")
_URL = "http://agent-env.local"  # the app is reached on its socket; the host only names it in messages
_STOP_GRACE_S = 12.0  # the runner's own grace (10 s), and a little more
_HEALTH_INTERVAL_S = 0.1


def is_agent_env_bundle(folder: Path) -> bool:
    """Whether ``folder`` is in agent-env's bundle format: task step lists (``tasks/*.json``) or evals
    (``evals/*.toml``)."""
    return any((folder / "tasks").glob("*.json")) or any((folder / "evals").glob("*.toml"))


def agent_env_python(given: str | None) -> str:
    """The interpreter that runs agent-env's app: ``given``, else ``GYMHOST_AGENT_ENV_PYTHON``, else this one when
    agent-env is installed beside gymhost."""
    python = given or configured_agent_env_python()
    if python is None and importlib.util.find_spec("agent_env") is not None:
        python = sys.executable
    if python is None:
        raise SourceError(
            "an agent-env bundle is served by agent-env's own OpenEnv app, in a venv with agentenv-framework[openenv] "
            "(its dependencies conflict with nemo-gym's): name that venv's Python with --python or "
            f"{AGENT_ENV_PYTHON_ENV_VAR}"
        )
    found = shutil.which(python)
    if found is None:
        raise SourceError(f"{python}: no such Python (the interpreter with agentenv-framework[openenv])")
    return str(Path(found).absolute())


class AgentEnvFrameworkApp:
    """agent-env's OpenEnv app for one bundle, as a process of this server's."""

    def __init__(
        self, process: asyncio.subprocess.Process, folder: Path, bundle: Path, output: HostedOutput | None
    ) -> None:
        self.process = process
        self.folder = folder
        self.socket = str(folder / "app.sock")
        self.bundle = bundle
        self.output = output

    @property
    def url(self) -> str:
        return _URL

    @classmethod
    async def start(
        cls, bundle: Path, python: str, sessions: int, timeout: float, *, quiet: bool = False
    ) -> AgentEnvFrameworkApp:
        """Start it and wait until it answers (``/health``), within ``timeout``: agent-env's import alone takes
        seconds. Its output is logged as hosted code's (``_hosted_output``), or, ``quiet``, goes to a log whose end a
        failure to start shows."""
        folder = scratch_folder("agent-env")
        log = (folder / "app.log").open("wb") if quiet else None
        ours, theirs = (None, None) if quiet else pair()
        environment = hosted_environment(  # never the server's own
            **{
                PARENT_PID_ENV_VAR: str(os.getpid()),
                "XDG_STATE_HOME": str(folder / "state"),  # agent-env's stores: every episode is recorded there
                "AGENT_ENV_LOCAL_SANDBOX_DIR": str(folder / "sandboxes"),
            }
        )
        try:
            process = await asyncio.create_subprocess_exec(
                python,
                str(_RUNNER),
                str(bundle),
                str(folder / "app.sock"),
                str(sessions),
                stdin=asyncio.subprocess.PIPE,  # closed (or this process dies): the app stops
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log if theirs is None else theirs.fileno(),
                env=environment,
            )
        except BaseException as error:  # an OSError, or cancelled: nothing of it is left behind
            remove(folder)
            if ours is not None:
                ours.close()
            if isinstance(error, OSError):
                raise StartupError(f"{python}: cannot run agent-env's OpenEnv app: {error}") from None
            raise
        finally:
            if log is not None:
                log.close()
            if theirs is not None:
                theirs.close()
        app = cls(process, folder, bundle, None)
        try:
            app.output = await relay(ours, bundle.parent.name) if ours is not None else None
        except BaseException:
            if ours is not None:
                ours.close()
            await app.stop()
            raise
        try:
            await app._ready(timeout)
        except BaseException:
            await app.stop()
            raise
        return app

    def exited(self) -> bool:
        return self.process.returncode is not None

    async def wait(self) -> None:
        await self.process.wait()

    async def stop(self) -> None:
        """Close its stdin and SIGTERM it (agent-env tears its episodes down), SIGKILL past the grace period, then
        remove its folder."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), _STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        remove(self.folder)

    def _output(self) -> str:
        """The end of what it printed: from the server's reading of it, or from its log file (``quiet``)."""
        if self.output is not None:
            return self.output.last_lines()
        try:
            lines = (self.folder / "app.log").read_text(errors="replace").strip().splitlines()
        except OSError as error:
            return f"its log could not be read: {error}"
        return "\n".join(lines[-15:]) or "it printed nothing"

    async def _ready(self, timeout: float) -> None:
        transport = httpx.AsyncHTTPTransport(uds=self.socket)
        async with httpx.AsyncClient(base_url=_URL, transport=transport, timeout=2.0) as client:
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                if self.exited():
                    if self.output is not None:  # what it printed as it failed, in the log before the error
                        await self.output.said()
                    raise StartupError(
                        f"agent-env's OpenEnv app for {self.bundle} exited with status {self.process.returncode} as it "
                        f"started (build_app refuses a bundle whose tasks cannot all be played): {self._output()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/health")).status_code == 200:
                        return
                if asyncio.get_running_loop().time() > deadline:
                    raise StartupError(
                        f"agent-env's OpenEnv app for {self.bundle} did not answer within {timeout:g}s "
                        "(startup_timeout_s)"
                    )
                await asyncio.sleep(_HEALTH_INTERVAL_S)


@asynccontextmanager
async def running_app(bundle: Path, python: str, settings: PoolSettings) -> AsyncIterator[AgentEnvFrameworkApp]:
    """The app for ``bundle`` while the block runs: what ``gymhost write`` reads the tasks and tools from."""
    app = await AgentEnvFrameworkApp.start(bundle, python, 1, settings.startup_timeout_s, quiet=True)
    try:
        yield app
    finally:
        await app.stop()


class AgentEnvFrameworkLauncher:
    """Sessions on agent-env's OpenEnv app for a bundle, which it runs (``_backend.Launcher``): started with the
    first instance, again when it has died (the pool replaces the instances it held, whose episodes were lost), and
    stopped with the pool. ``expected`` is where the written tasks say each task is, ``(split, index) -> name``; an
    app that serves other tasks there (the bundle changed since the folder was written) does not start."""

    owns_instances = True
    confinement_level = "none"  # agent-env's app, a process of gymhost's: its environment an allow-list, not confined

    def __init__(
        self,
        bundle: Path,
        python: str,
        environment: str,
        *,
        sessions: int,
        reply_tool: str | None,
        expected: Mapping[tuple[str, int], str],
    ) -> None:
        self.bundle = bundle
        self.python = python
        self.environment = environment
        self.sessions = sessions
        self.reply_tool = reply_tool
        self.expected = dict(expected)
        self.description = f"agent-env bundle {bundle} (agent-env's OpenEnv app, run by {python})"
        self._app: AgentEnvFrameworkApp | None = None
        self._sessions: OpenEnvLauncher | None = None
        self._apps: dict[int, AgentEnvFrameworkApp] = {}  # the app each instance's sessions are on, by instance index
        self._lock = asyncio.Lock()

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        async with self._lock:
            if self._app is None or self._app.exited():
                if self._app is not None:
                    logger.warning("agent-env's OpenEnv app for %s exited; starting it again", self.bundle)
                    await self._app.stop()
                self._app = await AgentEnvFrameworkApp.start(
                    self.bundle, self.python, self.sessions, settings.startup_timeout_s
                )
                try:
                    await self._check_tasks(self._app, settings)
                except BaseException:
                    await self._app.stop()
                    self._app = None
                    raise
                self._sessions = OpenEnvLauncher(
                    self._app.url, self.environment, reply_tool=self.reply_tool, uds=self._app.socket
                )
            assert self._sessions is not None
            self._apps[index] = self._app
            return Instance(index, OpenEnvClient(self._sessions, settings))

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()
        self._apps.pop(instance.index, None)

    async def exited(self, instance: Instance) -> None:
        """When the app its sessions are on has exited: every episode on it is lost, and the instance is replaced."""
        app = self._apps.get(instance.index)
        if app is None:
            await forever()
        else:
            await app.wait()

    async def close(self) -> None:
        async with self._lock:
            app, self._app = self._app, None
            if app is not None:
                await app.stop()

    async def _check_tasks(self, app: AgentEnvFrameworkApp, settings: PoolSettings) -> None:
        api = TaskApi(app.url, timeout=settings.data_timeout_s, uds=app.socket)
        try:
            for split in sorted({split for split, _ in self.expected}):
                served = await api.tasks(self.environment, split)
                for (name_split, index), name in self.expected.items():
                    if name_split != split or name == f"{split}-{index}":  # not a name: an id made of the place
                        continue
                    there = served[index].get("name") if 0 <= index < len(served) else None
                    if there != name:
                        raise StartupError(
                            f"{self.bundle}: agent-env serves {there!r} as task {index} of split {split!r}, where the "
                            f"folder's tasks have {name!r}: the bundle changed since the folder was written; write it "
                            "again"
                        )
        finally:
            await api.aclose()
