"""The agentenv protocol's two source kinds: ``bundle`` (gymhost's bundle format: an ``env.py`` holding one
``AgentEnvEnvironment``, with gymhost task files, whose instances the server runs, one process each or inside it) and
``urls`` (instances someone else runs, with tasks given to ``gymhost write --tasks``)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agentenv_protocol.client import find_extension
from pydantic import ByteSize, Field

from ..._config import (
    DEFAULT_INSTANCE_CPU_S,
    DEFAULT_INSTANCE_MEMORY,
    DEFAULT_INSTANCE_PIDS,
    DEFAULT_SANDBOX,
    Sandbox,
    configured_instance_limits,
    configured_network,
    configured_sandbox,
)
from ..._confinement import Limits, confinement, refuse_under_strict
from ..._exceptions import FolderError
from .._backend import Backend, Catalog, Launcher, ServerFolder, Source, WriteOptions
from .._catalog import checked
from .._errors import CatalogError, DataPlaneError, EnvUnavailableError, SourceError
from .._pool import Pool
from .._settings import DEFAULT_CONSTRUCT_ONCE, DEFAULT_MINIMUM, DEFAULT_MODE, Mode, PoolSettings, SourceConfig
from .._tasks import EnvironmentCriterion, ExtensionCriterion, Task, load_task_folder, load_tasks, write_task_folder
from ._client import EnvClient
from ._forking import BundleLauncher
from ._launchers import ENTRY, InProcessLauncher, UrlLauncher

__all__ = ["BUNDLE", "URLS", "BundleBackend", "BundleSource", "UrlsBackend", "UrlsSource", "is_url"]

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", ".git", ".pytest_cache", ".mypy_cache")


def is_url(given: str) -> bool:
    return given.startswith(("http://", "https://"))


def refuse_url_options(given: str, options: WriteOptions) -> None:
    """A bundle's source brings its own tasks and instances: the options of URL sources are refused."""
    if options.prompt_field is not None:
        raise SourceError(f"{given}: --prompt-field is for OpenEnv servers; a bundle's tasks hold their prompts")
    if options.extra_urls:
        raise SourceError("--url adds instances to an environment URL source; a bundle starts its own instances")
    if options.tasks_file is not None:
        raise SourceError(f"{given}: --tasks is for URL sources; a bundle's tasks are in its tasks/ folder")


def refuse_python(given: str, options: WriteOptions) -> None:
    if options.python is not None:
        raise SourceError(f"{given}: --python runs agent-env's app for an agent-env bundle; this is not one")


class BundleSource(SourceConfig):
    path: str | None = Field(default=None, description="the bundle's folder, relative to the server folder")
    mode: Mode = Field(default=DEFAULT_MODE, description="one process per instance, or instances inside the server")
    construct_once: bool = Field(
        default=DEFAULT_CONSTRUCT_ONCE,
        description="process mode: instances forked from one constructed environment (false: each constructs its own)",
    )
    sandbox: Sandbox = Field(
        default=DEFAULT_SANDBOX,
        description="process mode: how instances are confined (auto, strict, off); GYMHOST_SANDBOX overrides it",
    )
    # What a confined instance may take; reached, it is stopped and its episode masked (docs/security.md).
    instance_memory: ByteSize = Field(
        default=ByteSize(DEFAULT_INSTANCE_MEMORY),
        description="confined: an instance's memory (RLIMIT_DATA), as 2GiB; GYMHOST_INSTANCE_MEMORY overrides it",
    )
    instance_pids: int = Field(
        default=DEFAULT_INSTANCE_PIDS,
        ge=1,
        description="confined: an instance's processes and threads; GYMHOST_INSTANCE_PIDS overrides it",
    )
    instance_cpu_s: int = Field(
        default=DEFAULT_INSTANCE_CPU_S,
        ge=1,
        description="confined: an instance's seconds of CPU time (an episode's); GYMHOST_INSTANCE_CPU overrides it",
    )
    network: bool = Field(
        default=False,
        description="confined: whether instances may reach the network (false: nothing but their own loopback)",
    )
    fresh_instances: bool = Field(
        default=True,
        description="process mode: each episode on an instance of its own, forked fresh (false: reused, cleared)",
    )

    def limits(self) -> Limits:
        """Its instances' limits, the operator's (``gymhost serve --instance-memory``...) over the folder's."""
        given = {**self.model_dump(include={"instance_memory", "instance_pids", "instance_cpu_s"}),
                 **configured_instance_limits()}  # fmt: skip
        return Limits(
            memory_bytes=int(given["instance_memory"]),
            processes=int(given["instance_pids"]),
            cpu_seconds=int(given["instance_cpu_s"]),
        )


class UrlsSource(SourceConfig):
    urls: list[str] = Field(default_factory=list, description="one base URL per independent instance")


class _AgentenvBackend[S: SourceConfig](Backend[S]):
    protocol = "agentenv"

    def check_task(self, where: str, task: Task, catalog: Catalog) -> None:
        if task.tools is not None:
            raise CatalogError(
                f"{where}: task {task.id!r}: tools of its own are for OpenEnv environments whose tools exist only "
                f"inside an episode; agentenv environment {catalog.name!r} lists its tools on its card"
            )
        if task.seed.reset is not None:
            raise CatalogError(
                f"{where}: task {task.id!r}: seed.reset is for OpenEnv environments; {catalog.name!r} is an "
                "agentenv environment, seeded by seed.parts"
            )
        for criterion in task.grading.criteria:
            if isinstance(criterion, EnvironmentCriterion):
                raise CatalogError(
                    f"{where}: task {task.id!r}: grades with the environment's own reward, which agentenv "
                    f"environment {catalog.name!r} does not give; use state, response or extension criteria"
                )
            if isinstance(criterion, ExtensionCriterion) and find_extension(dict(catalog.card), criterion.uri) is None:
                raise CatalogError(
                    f"{where}: task {task.id!r}: grades with extension {criterion.uri}, which environment "
                    f"{catalog.name!r} does not advertise on its card"
                )

    def what_it_does(self) -> str:
        return """`/seed_session` leases an environment instance, resets it, loads the task's seed data and opens an MCP
session; each tool route (`POST /<tool>`) forwards the call over MCP and answers the tool's text (HTTP 400 when the
tool reports an error); `/verify` grades the episode from the task's criteria, tears it down and answers `reward`,
with `mask_sample` true only when the infrastructure failed."""


class BundleBackend(_AgentenvBackend[BundleSource]):
    kind = "bundle"
    source_config = BundleSource
    # A training run keeps hundreds of episodes open, each holding its instance while the model thinks, so the pool
    # grows on demand. Process mode: instances are forked from a template that imported the environment once, each
    # with memory of its own, so the bound leaves room for environments heavier than gridsim (benchmarks/README.md
    # measures an instance's memory); past it, seeds wait for releases. In-process, an idle instance costs little
    # memory and the bound is CPU.
    default_instances: ClassVar[Mapping[str, tuple[int, int]]] = {
        "process": (DEFAULT_MINIMUM, 256),
        "in_process": (DEFAULT_MINIMUM, 512),
    }

    def launcher(self, source: BundleSource, folder: ServerFolder) -> Launcher:
        if not source.path:
            raise FolderError(f"{folder.owner}: source.kind is bundle but source.path is not set")
        bundle = folder.resolve(source.path, "bundle")
        if not (bundle / ENTRY).is_file():
            raise FolderError(f"{bundle}: no {ENTRY}; a bundle holds its environment in {ENTRY}")
        sandbox = configured_sandbox() or source.sandbox  # the operator's choice over the folder's
        if source.mode == "in_process":
            refuse_under_strict(
                sandbox,
                f"{bundle} runs in-process, inside the server, where nothing confines it: write it with --mode process",
            )
            return InProcessLauncher(bundle)
        return BundleLauncher(
            bundle,
            construct_once=source.construct_once,
            confinement=confinement(sandbox),
            limits=source.limits(),
            network=source.network or configured_network(),
            fresh=source.fresh_instances,
            # Out of its hosted code's sight: the tasks (their grading and solutions), the bundle's own, and the
            # rest of the folder.
            unreadable=(folder.resolve(".", "server"), folder.tasks_folder, bundle / "tasks"),
        )

    def start_early(self, source: BundleSource, folder: ServerFolder, cwd: Path) -> None:
        """Process mode: the instance template, which imports the bundle (``BundleLauncher.start_early``)."""
        launcher = self.launcher(source, folder)
        if isinstance(launcher, BundleLauncher):
            launcher.start_early(cwd)

    async def inspect(self, given: str, options: WriteOptions) -> Source | None:
        if is_url(given):
            return None
        folder = Path(given)
        if (folder / ENTRY).is_file():
            refuse_python(given, options)
        refuse_url_options(given, options)
        if not folder.is_dir():
            raise SourceError(
                f"{folder}: not an http(s) URL and no such folder; expected a bundle or an environment URL"
            )
        bundle = folder.resolve()
        if not (bundle / ENTRY).is_file():
            raise SourceError(
                f"{bundle}: no {ENTRY}; a bundle holds one AgentEnvEnvironment subclass in {ENTRY} (gymhost's format), "
                "or tasks/<name>.json step lists (agent-env's)"
            )
        tasks = load_task_folder(bundle / "tasks")
        files = {name: bundle / "tasks" / f"{name}.jsonl" for name in tasks}
        if options.split is not None:
            if options.split not in tasks:
                raise SourceError(f"{bundle / 'tasks'}: no {options.split}.jsonl (splits: {', '.join(sorted(tasks))})")
            tasks, files = {options.split: tasks[options.split]}, {options.split: files[options.split]}
        pool = Pool(BundleLauncher(bundle), 1, 1, PoolSettings())  # one instance, with a server's default limits
        await pool.start()
        await pool.stop()
        return checked(Source(self.kind, pool.catalog, [], tasks, files, bundle=bundle), self.check_task)

    def source_fields(self, source: Source, instances: tuple[int, int], mode: str) -> list[tuple[str, Any, str]]:
        return [
            ("kind", self.kind, ""),
            ("path", "bundle", ""),
            ("mode", mode, ""),
            ("instances", instances[0], "always up"),
            ("max_instances", instances[1], "the most at once: started on demand, stopped after instance_idle_s free"),
        ]

    def copy_into(self, source: Source, folder: Path) -> str:
        assert source.bundle is not None
        shutil.copytree(source.bundle, folder / "bundle", ignore=IGNORED)
        return "bundle/tasks"

    def requirements(self, source: Source) -> list[str]:
        own = source.bundle / "requirements.txt" if source.bundle is not None else None
        if own is None or not own.is_file():
            return []
        lines = (line.strip() for line in own.read_text().splitlines())
        return [line for line in lines if line and not line.startswith("#")]


class UrlsBackend(_AgentenvBackend[UrlsSource]):
    kind = "urls"
    source_config = UrlsSource

    def launcher(self, source: UrlsSource, folder: ServerFolder) -> Launcher:
        if not source.urls:
            raise FolderError(f"{folder.owner}: source.kind is urls but source.urls is empty")
        return UrlLauncher(source.urls)

    def bounds(self, source: UrlsSource) -> tuple[int, int]:
        return len(source.urls), len(source.urls)  # exactly its URLs

    def instances(self, mode: str) -> tuple[int, int]:
        return 1, 1  # unused: a URL source's instances are its URLs, and its config block names no count

    async def inspect(self, given: str, options: WriteOptions) -> Source | None:
        if not is_url(given):
            return None
        refuse_python(given, options)
        if options.prompt_field is not None:
            raise SourceError(f"{given}: --prompt-field is for OpenEnv servers, whose tasks carry their prompts")
        if options.tasks_file is None:
            raise SourceError(
                f"{given}: not an OpenEnv server (GET /list_environments names no environment), and an agentenv "
                "environment has no tasks of its own: give them with --tasks FILE"
            )
        tasks = {options.split or options.tasks_file.stem: load_tasks(options.tasks_file)}
        files = {name: options.tasks_file.resolve() for name in tasks}
        clients = [EnvClient(url, data_timeout=PoolSettings().data_timeout_s) for url in [given, *options.extra_urls]]
        try:
            catalogs = []
            for client in clients:
                try:
                    catalogs.append(await client.describe())
                except (EnvUnavailableError, DataPlaneError) as error:
                    raise SourceError(f"{client.base_url}: no environment card answered: {error}") from None
            names = {catalog.name for catalog in catalogs}
            if len(names) > 1:
                raise SourceError(f"the URLs serve different environments ({', '.join(sorted(names))}); a pool is one")
            catalog = catalogs[0].with_hidden(await clients[0].hidden_tools(catalogs[0]))
        finally:
            await asyncio.gather(*(client.aclose() for client in clients))
        urls = [client.base_url for client in clients]
        return checked(Source(self.kind, catalog, [], tasks, files, urls=urls), self.check_task)

    def source_fields(self, source: Source, instances: tuple[int, int], mode: str) -> list[tuple[str, Any, str]]:
        return [("kind", self.kind, ""), ("urls", [json.dumps(url) for url in source.urls], "")]

    def copy_into(self, source: Source, folder: Path) -> str:
        write_task_folder(folder / "tasks", source.tasks, source.task_files)
        return "tasks"


BUNDLE = BundleBackend()
URLS = UrlsBackend()
