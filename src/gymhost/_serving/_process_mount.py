"""A gateway's folder served by a gymhost process of its own, under its prefix.

A gateway puts its folders in one process, and so in one set of installed packages and one confinement. A folder
whose requirements that process does not meet gets a venv of its own (``_venvs``) and a process of its own; so does
a Gym server under ``--sandbox strict`` in a gateway that also serves written folders (``_confined``): ``gymhost
serve FOLDER`` (from that venv), on a Unix socket in a private folder, with the prefix as its root path, so its
cookies, MCP URLs and rollout paths are the prefix's as if it were mounted. ``ProcessMount`` is the app the gateway
mounts in its place: its lifespan starts the process and waits for it to be ready; each request is forwarded to it
(``_forwarding``), with the path below the prefix; the gateway's readiness, drain and metrics cover it (it reports
its readiness and open episodes, it drains when the gateway drains, and its metrics go to the folder the gateway
renders from). A process that dies is started again (its episodes are lost, and answered so by its successor); it
dies with the gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from .._asgi import answer_json, path_below_mount
from .._config import PARENT_PID_ENV_VAR, SECRET_ENV_VAR, MaskedVerdicts, ServeConfig
from .._drain import drain
from .._exceptions import GatewayError
from .._hosting._operating import OPEN_EPISODES_HEADER, OPERATIONS
from .._scratch import remove, scratch_folder
from .._sessions._forwarding import Forwarded, forward
from .._sessions._signing import process_secret

__all__ = ["ProcessMount", "serving_apart"]

logger = logging.getLogger("gymhost")

_POLL_S = 1.0  # how often the process's readiness and open episodes are read
_START_TIMEOUT_S = 120.0  # importing a server in a fresh venv can take a while
_RESTART_PAUSE_S = 1.0


class _Status:
    """What the gateway's readiness and drain read of the process (``_operating``'s ``Operations``, in part)."""

    def __init__(self, mount: str) -> None:
        self.mount = mount
        self.reason: str | None = "starting: its process is starting"
        self.open = 0

    def not_ready(self) -> str | None:
        return self.reason

    def open_episodes(self) -> int:
        return self.open


def serving_apart(
    config: ServeConfig, server_urls: Mapping[str, str], masked_verdicts: MaskedVerdicts, *, workers: int = 1
) -> Callable[[str, Path], Any] | None:
    """For ``build_gateway``'s ``apart``, the folders served by a ``ProcessMount`` rather than in the gateway: with
    ``--venv``, a folder whose requirements this environment does not meet (from a venv of its own); under
    ``--sandbox strict``, a Gym server's folder (its own process is confined, ``_confined``; the gateway's, which
    holds written folders, is not). None: every folder is built in the gateway.

    Not under ``--workers``: each worker would start a process of its own for the folder, stamping sessions with
    its own identity, which no worker routes by; the episodes of a request reaching the other worker would be lost.
    Refused at start instead."""
    from .._config import configured_sandbox
    from .._hosting._folder import load_server_spec
    from .._hosting._venvs import folder_venv, unmet_requirements
    from ._confined import inside

    confine = configured_sandbox() == "strict" and not inside
    if not (config.venv or confine):
        return None

    def apart(prefix: str, folder: Path) -> ProcessMount | None:
        own_venv = config.venv and bool(unmet_requirements(folder))
        confined = confine and not load_server_spec(folder, config_key=config.config_key).written
        if not (own_venv or confined):
            return None
        if workers > 1:
            why = "needs a venv of its own" if own_venv else "is a Gym server, confined under --sandbox strict"
            raise GatewayError(
                f"{prefix}: {folder.name} {why}, and so a process of its own, whose sessions --workers {workers} "
                "cannot route yet. Serve this Gym root with one worker (and replicas behind a load balancer, "
                "deploy/), or serve the folder alone with --workers N"
            )
        python = folder_venv(folder) if own_venv else Path(sys.executable)
        return ProcessMount(folder, python, prefix, config, server_urls, masked_verdicts, confined=confined)

    return apart


class ProcessMount:
    """The ASGI app a gateway mounts at ``prefix`` for a folder served by a process of its own (``python``)."""

    def __init__(
        self,
        folder: Path,
        python: Path,
        prefix: str,
        config: ServeConfig,
        server_urls: Mapping[str, str],
        masked_verdicts: MaskedVerdicts = "refuse",
        *,
        confined: bool = False,
    ) -> None:
        """``confined``: its server runs confined (``_confined``), so the code it runs may write among its metrics."""
        self.folder, self.python, self.prefix, self.config = folder, python, prefix, config
        self.confined = confined
        self.masked_verdicts = masked_verdicts  # the process applies the gateway's rule to its verdicts
        self.server_urls = dict(server_urls)
        self.status = _Status(prefix)
        self._process: asyncio.subprocess.Process | None = None
        self._socket: Path | None = None
        self._stopping = False
        self._signalled = False
        self.app = Starlette(lifespan=self._lifespan)
        OPERATIONS.set(self.app, self.status)  # the gateway's /readyz reads it
        self.app.router.routes.append(_Proxy(self))  # type: ignore[arg-type]

    @property
    def router(self) -> Any:
        return self.app.router

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[None]:
        folder = scratch_folder("mount")
        self._socket = folder / "server.sock"
        forget = drain.count_open(id(self), self.status.open_episodes)
        watch: asyncio.Task[None] | None = None
        try:
            await self._start()
            watch = asyncio.get_running_loop().create_task(self._watch(), name=f"gymhost-mount{self.prefix}")
            yield
        finally:
            self._stopping = True
            if watch is not None:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
            forget()
            await self._stop()
            remove(folder)

    async def _start(self) -> None:
        assert self._socket is not None
        with contextlib.suppress(FileNotFoundError):
            self._socket.unlink()
        command = [str(self.python), "-m", "gymhost", "serve", str(self.folder), "--uds", str(self._socket)]
        command += ["--root-path", self.prefix, "--log-level", self.config.log_level]
        command += ["--log-format", self.config.log_format]  # its lines as the gateway's: JSON among JSON
        command += ["--drain-timeout", str(self.config.drain_timeout)]
        command += ["--graceful-timeout", str(self.config.graceful_timeout)]
        command += ["--masked-verdicts", self.masked_verdicts]
        for name, url in self.server_urls.items():
            command += ["--server-url", f"{name}={url}"]
        # os.environ holds no secret setting (taken at start); the process takes what it is given here at its own.
        environment = {**os.environ, SECRET_ENV_VAR: process_secret()}  # its sessions stay valid across its restarts
        environment[PARENT_PID_ENV_VAR] = str(os.getpid())
        self._process = await asyncio.create_subprocess_exec(*command, env=environment, start_new_session=True)
        self._signalled = False
        deadline = asyncio.get_running_loop().time() + _START_TIMEOUT_S
        while not await self._poll():
            if self._process.returncode is not None:
                raise GatewayError(
                    f"{self.prefix}: the process serving {self.folder} from its own venv exited with "
                    f"{self._process.returncode} as it started; its output above says why"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise GatewayError(
                    f"{self.prefix}: the process serving {self.folder} was not ready in {_START_TIMEOUT_S:g}s"
                )
            await asyncio.sleep(0.1)

    async def _watch(self) -> None:
        """Read its readiness and open episodes; drain it when the gateway drains; start it again when it died."""
        while True:
            await asyncio.sleep(_POLL_S)
            process = self._process
            if process is not None and process.returncode is not None and not self._stopping:
                self.status.reason, self.status.open = "starting: its process exited and is starting again", 0
                logger.error(
                    "%s: the process serving %s exited with %s; starting it again",
                    self.prefix,
                    self.folder,
                    process.returncode,
                )
                await asyncio.sleep(_RESTART_PAUSE_S)
                with contextlib.suppress(GatewayError):
                    await self._start()
                continue
            if drain.draining and not self._signalled and process is not None:
                self._signalled = True
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)  # it drains too: no new episodes, open ones go on
            await self._poll()

    async def _poll(self) -> bool:
        """Whether the process is ready; its readiness reason and open episodes noted: as its readiness answer says
        (counted in the process; its ``/metrics`` adds up what the code a confined server runs may write), or,
        from a gymhost of a folder's own venv that does not say, from its ``/metrics``, unless it runs confined:
        then, not knowing, as at least one (a drain waits for it until its timeout)."""
        try:
            async with self._client(timeout=2.0) as client:
                ready = await client.get("/readyz")
                said = ready.headers.get(OPEN_EPISODES_HEADER, "")
                said_it = said.isascii() and said.isdigit()
                metrics = None if said_it or self.confined else await client.get("/metrics")
        except httpx.TransportError:
            self.status.reason = "starting: its process is not answering yet"
            return False
        body = ready.json() if ready.headers.get("content-type", "").startswith("application/json") else {}
        self.status.reason = None if ready.status_code == 200 else str(body.get("reason") or ready.text[:200])
        if said_it:
            self.status.open = int(said)
        elif metrics is not None:
            self.status.open = _open_episodes(metrics.text)
        else:
            self.status.open = max(self.status.open, 1)
        return ready.status_code == 200

    async def _stop(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        if not self._signalled:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.config.drain_timeout + self.config.graceful_timeout + 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    def _client(self, timeout: float) -> httpx.AsyncClient:
        assert self._socket is not None
        transport = httpx.AsyncHTTPTransport(uds=str(self._socket))
        return httpx.AsyncClient(transport=transport, base_url="http://gymhost-mount", timeout=timeout)

    async def proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = path_below_mount(scope)
        target = ("worker", str(self._socket))
        outcome = Forwarded.GONE
        if self._process is not None and self._process.returncode is None:
            outcome = await forward(scope, receive, send, target, path=path.encode())
        if outcome is not Forwarded.ANSWERED:
            why = "is busy" if outcome is Forwarded.BUSY else "is not running: its process is starting again"
            detail = {"detail": f"the server at {self.prefix} {why}"}
            await answer_json(scope, receive, send, 503, detail, {"Retry-After": "1"})


class _Proxy:
    """The one route of a ``ProcessMount``: every HTTP request goes to its process."""

    def __init__(self, mount: ProcessMount) -> None:
        self.mount = mount
        self.path = ""

    def matches(self, scope: Scope) -> tuple[Any, dict[str, Any]]:
        from starlette.routing import Match

        return (Match.FULL, {}) if scope["type"] == "http" else (Match.NONE, {})

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.mount.proxy(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        from starlette.routing import NoMatchFound

        raise NoMatchFound(name, path_params)


def _open_episodes(exposition: str) -> int:
    """``gymhost_episodes_open`` summed over the process's series."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(exposition))
    except ValueError:
        return 0
    return int(sum(s.value for f in families if f.name == "gymhost_episodes_open" for s in f.samples))
