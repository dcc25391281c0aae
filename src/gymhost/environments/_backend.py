"""The one interface between the bridge (this package) and a protocol backend (``_agentenv/``, ``_openenv/``).

The bridge plays Gym episodes on *instances* of an environment: the pool leases one per episode, the episode state
machine seeds it, calls its tools and grades it. How an instance is reached is a backend's, one per ``source.kind``
(``_registry``). A backend gives:

- ``Backend``: what ``gymhost write`` reads from a source of its kind (``inspect``) and writes of it
  (``source_fields``, ``copy_into``, ``requirements``, ``what_it_does``), how a server gets its instances from its
  config (``launcher``), and the rules its protocol sets for tasks (``check_task``).
- ``Launcher``: brings one instance up and takes it down, and says when one ended by itself; the pool decides when.
- ``InstanceClient``: what the pool and an episode ask of one instance. The pool: what the environment offers
  (``describe``, a ``Catalog``), a clean slate between episodes (``clear``), its state for the pool view. An
  episode (``EnvironmentClient``'s part): begin the task from its seed, a ``ToolSession`` for the model's calls,
  what grading reads of it (``observe``: the server grades, and never tells an instance its task's answers).

The pool (``_pool.Pool``) and the episodes (``_episodes.Episodes``) see only these; ``InstancePool`` is what the
episodes need of the pool, so the unit tests can give them a fake one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Final, Protocol

from agentenv_protocol import ToolResult

from .._exceptions import FolderError
from ._grading import Asked, Observation
from ._outcomes import Failure
from ._settings import PoolSettings, SourceConfig
from ._tasks import Seed, Task

__all__ = [
    "ELSEWHERE",
    "INSTANCE_STATES",
    "Backend",
    "Catalog",
    "EnvironmentClient",
    "Instance",
    "InstanceClient",
    "InstancePool",
    "InstanceProcess",
    "Launcher",
    "LeasedInstance",
    "ServerFolder",
    "Source",
    "ToolSession",
    "WriteOptions",
    "resolve_in",
]

Tool = dict[str, Any]  # a tool as MCP lists it: name, description, inputSchema (and _meta)
# What an instance is doing, as the pool view and the gymhost_instances gauge count them: serving an episode, free,
# being cleared after one, out of rotation until it answers again (a URL's) or replaced, and coming and going.
INSTANCE_STATES = ("free", "leased", "resetting", "repairing", "starting", "stopping")
ELSEWHERE: Final = "elsewhere"  # a launcher's confinement_level when someone else runs its instances


@dataclass(frozen=True, slots=True)
class Catalog:
    """What an environment offers, as the bridge reads it from a live instance: its name, the tools it lists (those
    ``hidden`` are plumbing a task drives, never the model's to call), and the protocol's own description of it
    (agentenv's card: where its MCP server and grade extensions are), which only its backend reads."""

    name: str
    tools: tuple[Tool, ...] = ()
    hidden: frozenset[str] = frozenset()
    card: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, tuple[str, ...]]:
        """What makes two instances the same environment: the name and the tools."""
        return self.name, tuple(sorted(str(tool.get("name", "")) for tool in self.tools))

    def policy_tools(self) -> list[Tool]:
        """The tools a model may call."""
        return [tool for tool in self.tools if tool.get("name") not in self.hidden]

    def with_hidden(self, hidden: set[str] | frozenset[str]) -> Catalog:
        return replace(self, hidden=frozenset(hidden))


class ToolSession(Protocol):
    """An episode's tool calls on its instance (an MCP session, direct calls, an OpenEnv session's steps)."""

    async def open(self) -> ToolSession: ...
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...
    async def list_tools(self) -> list[Tool]: ...
    async def close(self) -> None: ...


class EnvironmentClient(Protocol):
    """What an episode asks of its instance: to begin the task from its seed (on the clean slate the pool leased it
    with), a tool session, and what grading reads of what was done."""

    async def begin(self, seed: Seed) -> None: ...
    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> ToolSession: ...
    async def observe(self, catalog: Catalog, asked: Asked, final_text: str) -> Observation:
        """What grading needs of the instance; the server grades it against the task (``Observation.graded``)."""
        ...


class InstanceClient(EnvironmentClient, Protocol):
    """All an instance answers: the episode's part, and the pool's."""

    base_url: str

    async def describe(self) -> Catalog:
        """What the environment offers, without its hidden tools (which may cost more to learn); cheap enough to be
        the pool's check that the instance answers."""
        ...

    async def hidden_tools(self, catalog: Catalog) -> set[str]: ...

    async def clear(self) -> None:
        """Leave the instance as if no episode had touched it (the environment's own reset): before its first
        episode, after each, and before each lease of an instance at a URL, which others may have used."""
        ...

    async def state(self) -> Any:
        """The instance's state as an operator reads it (the pool view's ``data``)."""
        ...

    async def aclose(self) -> None: ...


class InstanceProcess(Protocol):
    """An instance's process, as the pool and its launcher handle it."""

    pid: int

    def exited_now(self) -> bool: ...
    async def wait(self) -> None: ...
    def kill(self) -> None: ...
    def pause(self) -> bool:
        """Stop running now (``SIGSTOP``), for a ``kill`` a moment later; False when it cannot (or has exited)."""
        ...

    async def terminate(self) -> None: ...


@dataclass(eq=False)
class Instance:
    """One instance, as the pool keeps it; ``process`` and ``hosted`` are its launcher's."""

    index: int
    client: InstanceClient
    process: InstanceProcess | None = None
    hosted: Any = None
    leased: bool = False
    healthy: bool = True
    queued: bool = False  # in the pool's free list, ready for the next lease
    retired: bool = False  # taken out of the pool: stopped on purpose, or broken and replaced
    one_episode: bool = False  # replaced after its episode, never cleared for another (a fresh fork each)
    cleared: bool = False  # reset since it started (its launcher's) or since its last episode (the pool's)
    episodes: int = 0
    free_since: float = 0.0  # loop time it last became free: the pool stops the ones free too long

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def status(self) -> dict[str, Any]:
        # "resetting": released, its clean slate still being made, not yet free
        state = "leased" if self.leased else "repairing" if not self.healthy else "free" if self.queued else "resetting"
        pid = self.process.pid if self.process is not None else None
        return {"index": self.index, "url": self.base_url, "state": state, "episodes": self.episodes, "pid": pid}


class Launcher(Protocol):
    """Brings instance ``index`` up and takes it down, and says when one ends by itself."""

    description: str
    # Whether it makes its instances: such a pool grows, shrinks and replaces broken ones; instances someone else
    # runs (URLs) are waited for when they break.
    owns_instances: bool
    # What confines its instances' code: a level of ``gymhost._confinement`` (namespaces, landlock, ...), or ELSEWHERE
    # (someone else runs them).
    confinement_level: str

    async def launch(self, index: int, settings: PoolSettings) -> Instance: ...

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        """Take it down; not ``graceful`` when it is broken, and a request stuck in it would only delay the end."""
        ...

    async def exited(self, instance: Instance) -> Failure | None:
        """Return when the instance has ended, whoever ended it (never, for one this launcher cannot watch): with
        why, when the instance said (a limit it reached)."""
        ...

    async def close(self) -> None:
        """After the last instance stopped: release what the launcher itself holds."""
        ...


class LeasedInstance(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def client(self) -> EnvironmentClient: ...


class InstancePool(Protocol):
    """The instances episodes are played on (``_pool.Pool``)."""

    catalog: Catalog

    async def start(self) -> None: ...
    def begin_stop(self) -> None: ...
    async def stop(self) -> None: ...
    def lease_deadline(self) -> float:
        """When a lease started now stops waiting (loop time): a seed that tries another instance keeps it."""
        ...

    async def lease(self, deadline: float | None = None) -> LeasedInstance: ...
    async def release(self, instance: Any, failure: Failure | None) -> None: ...
    def status(self) -> dict[str, Any]: ...
    def not_ready(self) -> str | None: ...
    async def instance_status(self, index: int) -> dict[str, Any] | None: ...


# -- writing a folder ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """What ``gymhost write`` was told besides SOURCE; a backend refuses what its kind has no use for."""

    extra_urls: Sequence[str] = ()
    tasks_file: Path | None = None
    split: str | None = None
    prompt_field: str | None = None
    python: str | None = None


@dataclass
class Source:
    """A source as ``gymhost write`` read it: its kind, what the environment offers, the tasks, and where it is."""

    kind: str
    catalog: Catalog
    tools: list[Tool]  # the tools the server routes (``_catalog.server_tools``)
    tasks: dict[str, list[Task]]
    task_files: dict[str, Path]  # split -> the file it came from, for tasks that came from one
    bundle: Path | None = None
    urls: list[str] = field(default_factory=list)
    reply_tool: str | None = None  # OpenEnv: the tool that ends the model's turn with its reply (agent-env's end_turn)
    python: str | None = None  # an agent-env bundle: the interpreter that runs agent-env's app

    @property
    def environment(self) -> str:
        return self.catalog.name


@dataclass(frozen=True)
class ServerFolder:
    """What a server's launcher may need of its folder: paths in it, its tasks and where they are (hosted code may
    not read them: their grading and solutions), the environment it was written for, and the server class's name,
    for messages."""

    resolve: Callable[[str, str], Path]  # (a config value, what it names) -> an existing path in the folder
    tasks: Mapping[str, list[Task]]
    environment: str
    owner: str
    tasks_folder: Path


def resolve_in(base: Path, value: str, what: str, owner: str) -> Path:
    """``value``, a path a server's config gives relative to its folder ``base``, as an existing absolute path."""
    path = (base / value).resolve()
    if not path.exists():
        raise FolderError(f"{path}: no such {what} folder (config field of {owner}: {value!r})")
    return path


class Backend[SourceFields: SourceConfig]:
    """One ``source.kind``. A subclass sets ``kind``, ``protocol`` and ``source_config`` (its kind's ``source`` block,
    a ``SourceConfig`` with the fields it reads) and gives ``launcher`` and ``inspect``; the rest has defaults that fit
    a source that brings nothing of its own into the folder."""

    kind: str  # the config's source.kind
    protocol: str  # the protocol's name, as a user reads it ("agentenv", "OpenEnv", "agent-env")
    source_config: type[SourceConfig] = SourceConfig  # SourceFields: the class the server reads the block with
    # (minimum, maximum) instances when `gymhost write` is not told, by mode (a bundle's) or "" (any other kind)
    default_instances: ClassVar[Mapping[str, tuple[int, int]]] = {}

    # -- serve time: a written server's instances ----------------------------------------------------------------------

    def launcher(self, source: SourceFields, folder: ServerFolder) -> Launcher:
        raise NotImplementedError

    def start_early(self, source: SourceFields, folder: ServerFolder, cwd: Path) -> None:
        """Start what the server's launcher will start first, before the server is built (``_early``), where that
        is worth it; by default nothing."""

    def bounds(self, source: SourceFields) -> tuple[int, int]:
        """(minimum, maximum) instances of a server with this source."""
        return source.instances, source.max_instances or source.instances

    # -- both: the protocol's rules for tasks --------------------------------------------------------------------------

    def check_task(self, where: str, task: Task, catalog: Catalog) -> None:
        """Refuse (``CatalogError``) a task this protocol cannot seed or grade; the writer and the server ask."""

    # -- write time: gymhost write (``_writing``) ----------------------------------------------------------------------

    async def inspect(self, given: str, options: WriteOptions) -> Source | None:
        """``given`` read as a source of this kind, or None when it is none (the registry asks the next)."""
        raise NotImplementedError

    def instances(self, mode: str) -> tuple[int, int]:
        return self.default_instances.get(mode) or self.default_instances[""]

    def source_fields(self, source: Source, instances: tuple[int, int], mode: str) -> list[tuple[str, Any, str]]:
        """The written config's ``source`` block: ``(field, value, comment)``, in order (``kind`` comes first)."""
        raise NotImplementedError

    def copy_into(self, source: Source, folder: Path) -> str:
        """Put what the server needs of the source into the folder being written; the tasks' folder in it."""
        raise NotImplementedError

    def requirements(self, source: Source) -> list[str]:
        """Lines the written folder's requirements.txt needs for this source, beyond gymhost's own."""
        return []

    def what_it_does(self) -> str:
        """The written README's account of an episode, in Markdown."""
        raise NotImplementedError


async def forever() -> None:
    """For a launcher with nothing to watch: an instance whose loss shows on its next call."""
    await asyncio.Event().wait()
