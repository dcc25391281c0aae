"""The OpenEnv protocol's two source kinds: ``openenv`` (an OpenEnv server at a URL, its Task API giving the tasks)
and ``agent_env`` (an agent-env bundle folder, whose OpenEnv app the written server runs itself, ``_agent_env``).

Either way a task is seeded by OpenEnv's ``reset`` with its split and index (``seed.reset``) and graded by the
environment's own reward, or by the final text; the turn a model answers in its final message is ended at verify
through the reply tool (agent-env's ``end_turn``) when the environment has one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from ..._config import configured_sandbox
from ..._confinement import refuse_under_strict
from ..._exceptions import FolderError
from .._agentenv._backends import IGNORED, is_url, refuse_python, refuse_url_options
from .._agentenv._launchers import ENTRY
from .._backend import Backend, Catalog, Launcher, ServerFolder, Source, WriteOptions
from .._catalog import checked
from .._errors import CatalogError, DataPlaneError, EnvUnavailableError, SourceError, StartupError
from .._settings import PoolSettings, SourceConfig
from .._tasks import ExtensionCriterion, StateCriterion, Task, load_tasks, write_task_folder
from ._agent_env import AgentEnvFrameworkLauncher, agent_env_python, is_agent_env_bundle, running_app
from ._client import OpenEnvLauncher
from ._task_api import TaskApi
from ._tasks import openenv_tasks

__all__ = [
    "AGENT_ENV",
    "OPENENV",
    "AgentEnvFrameworkBackend",
    "AgentEnvFrameworkSource",
    "OpenEnvBackend",
    "OpenEnvSource",
    "reply_tool",
]

_END_TURN = "end_turn"
_REPLY_TOOL_COMMENT = "a verify ends the model's open turn with its final text through it"
_PYTHON_COMMENT = "a venv with agentenv-framework[openenv]: it runs agent-env's OpenEnv app"
_SESSIONS_COMMENT = "sessions the pool keeps the right to (a session opens when an episode starts)"


def reply_tool(tools: list[dict[str, Any]]) -> str | None:
    """agent-env's ``end_turn`` (a tool of that name taking a ``response``), when the environment has it: the turn a
    model answers in its final message instead is ended with that message at verify."""
    for tool in tools:
        if tool.get("name") == _END_TURN and "response" in ((tool.get("inputSchema") or {}).get("properties") or {}):
            return _END_TURN
    return None


class _RepliedSource(SourceConfig):
    reply_tool: str | None = Field(
        default=None,
        description="the tool that ends the model's turn with its reply (agent-env's end_turn), which a verify calls "
        "with the final assistant text while the turn is open; unset: none",
    )


class OpenEnvSource(_RepliedSource):
    urls: list[str] = Field(default_factory=list, description="the one URL of the OpenEnv server")


class AgentEnvFrameworkSource(_RepliedSource):
    path: str | None = Field(default=None, description="the bundle's folder, relative to the server folder")
    python: str | None = Field(
        default=None,
        description="the Python of a venv with agentenv-framework[openenv], which runs agent-env's OpenEnv app for "
        "the bundle",
    )


class _OpenEnvProtocol[S: SourceConfig](Backend[S]):
    def check_task(self, where: str, task: Task, catalog: Catalog) -> None:
        if task.seed.reset is None or task.seed.parts:
            raise CatalogError(
                f"{where}: task {task.id!r}: an OpenEnv task is seeded by seed.reset (the data of its reset "
                "message, e.g. the split and index), not by data parts"
            )
        for criterion in task.grading.criteria:
            if isinstance(criterion, StateCriterion | ExtensionCriterion):
                raise CatalogError(
                    f"{where}: task {task.id!r}: a {criterion.kind} criterion needs the agentenv data plane; an "
                    'OpenEnv environment is graded by its own reward ({"kind": "environment"}) or the final text'
                )

    def copy_into(self, source: Source, folder: Path) -> str:
        write_task_folder(folder / "tasks", source.tasks, source.task_files)
        return "tasks"


async def _inspect_server(
    kind: str,
    rule: _OpenEnvProtocol[Any],
    api: TaskApi,
    environments: list[str],
    options: WriteOptions,
    *,
    uds: str | None = None,
) -> Source:
    """An OpenEnv server's one environment: its catalog over a session, its tasks from the Task API (or the
    ``--tasks`` file), each task's tools after its reset when the environment lists none before one."""
    if len(environments) != 1:
        raise SourceError(
            f"{api.base_url}: serves {len(environments)} environments ({', '.join(environments)}); "
            "gymhost writes a server for one"
        )
    launcher = OpenEnvLauncher(api.base_url, environments[0], uds=uds)
    try:
        catalog = await launcher.catalog(PoolSettings())
    except (EnvUnavailableError, DataPlaneError) as error:
        raise SourceError(f"{api.base_url}: the OpenEnv server's tools could not be listed over /ws: {error}") from None
    if options.tasks_file is not None:
        if options.prompt_field is not None:
            raise SourceError("--prompt-field reads the OpenEnv server's tasks; tasks from --tasks hold their prompts")
        tasks = {options.split or options.tasks_file.stem: load_tasks(options.tasks_file)}
        files = {name: options.tasks_file.resolve() for name in tasks}
    else:
        own_tools = not catalog.tools  # its tools exist only inside an episode: each task's are read after its reset
        try:
            tasks = await openenv_tasks(api, launcher, options.split, options.prompt_field, own_tools=own_tools)
        except (EnvUnavailableError, DataPlaneError) as error:
            raise SourceError(f"{api.base_url}: reading the tasks' resets failed: {error}") from None
        files = {}
    source = checked(Source(kind, catalog, [], tasks, files, urls=[api.base_url]), rule.check_task)
    source.reply_tool = reply_tool(source.tools)
    return source


class OpenEnvBackend(_OpenEnvProtocol[OpenEnvSource]):
    kind = "openenv"
    protocol = "OpenEnv"
    source_config = OpenEnvSource
    # An OpenEnv server's instances are its sessions, which the server bounds (max_concurrent_envs, 1 unless its
    # author raised it): one, and seeds beyond it wait for it; say the server's number with --instances.
    default_instances: ClassVar[Mapping[str, tuple[int, int]]] = {"": (1, 1)}

    def launcher(self, source: OpenEnvSource, folder: ServerFolder) -> Launcher:
        if len(source.urls) != 1:
            raise FolderError(f"{folder.owner}: source.kind is openenv; source.urls needs its one URL")
        return OpenEnvLauncher(source.urls[0], folder.environment, reply_tool=source.reply_tool)

    async def inspect(self, given: str, options: WriteOptions) -> Source | None:
        if not is_url(given):
            return None
        refuse_python(given, options)
        api = TaskApi(given, timeout=PoolSettings().data_timeout_s)
        try:
            try:
                environments = await api.environments()
            except EnvUnavailableError as error:
                if options.tasks_file is None:
                    raise SourceError(str(error)) from None
                return None  # an agentenv instance's card may answer there: its probe says what it meets
            if environments is None:
                return None
            if options.extra_urls:
                raise SourceError(f"{given}: an OpenEnv server is one URL; --url is for agentenv instances")
            return await _inspect_server(self.kind, self, api, environments, options)
        finally:
            await api.aclose()

    def source_fields(self, source: Source, instances: tuple[int, int], mode: str) -> list[tuple[str, Any, str]]:
        return [
            ("kind", self.kind, ""),
            ("urls", [json.dumps(source.urls[0])], ""),
            ("reply_tool", json.dumps(source.reply_tool), _REPLY_TOOL_COMMENT),
            ("instances", instances[0], _SESSIONS_COMMENT),
            (
                "max_instances",
                instances[1],
                "the most episodes at once: at most the OpenEnv server's max_concurrent_envs",
            ),
        ]

    def what_it_does(self) -> str:
        return """Each episode is one OpenEnv session: `/seed_session` opens a WebSocket to the server's `/ws` and
resets it to the row's split and index (`tasks/<split>.jsonl`, `seed.reset`); each tool route (`POST /<tool>`) is a
`call_tool` step and answers the tool's text (HTTP 400, with the environment's message, when the tool or its
arguments failed); `/verify` answers the environment's own reward, the sum of the rewards of the reset and of every
step (as NeMo Gym's OpenEnv adapter counts it), and closes the session. A session the server dropped or refused, or
a connection lost, is a masked sample (`mask_sample` true, with a `failure_kind`), never a 0.0. At most
`max_instances` sessions are open at once: keep it at most the server's `max_concurrent_envs`; seeds beyond it
wait for a session to end."""


class AgentEnvFrameworkBackend(_OpenEnvProtocol[AgentEnvFrameworkSource]):
    kind = "agent_env"
    protocol = "agent-env"
    source_config = AgentEnvFrameworkSource
    # agent-env's app for a bundle is started by the written server itself, with max_concurrent_envs its maximum:
    # agent-env's own default, 8 (every episode runs an agent proxy with a server of its own in that process).
    default_instances: ClassVar[Mapping[str, tuple[int, int]]] = {"": (1, 8)}

    def launcher(self, source: AgentEnvFrameworkSource, folder: ServerFolder) -> Launcher:
        if not source.path or not source.python:
            raise FolderError(f"{folder.owner}: source.kind is agent_env; it needs source.path and source.python")
        refuse_under_strict(
            configured_sandbox(), "agent-env's app, which runs a written agent_env folder, is not confined"
        )
        python = shutil.which(source.python)
        if python is None:
            raise FolderError(
                f"{folder.owner}: source.python {source.python!r} is no Python here: name the Python of a "
                "venv with agentenv-framework[openenv] (--set source.python=PATH)"
            )
        expected = {
            (str(task.seed.reset.get("split")), int(task.seed.reset.get("index", -1))): task.id
            for tasks in folder.tasks.values()
            for task in tasks
            if task.seed.reset is not None
        }
        return AgentEnvFrameworkLauncher(
            folder.resolve(source.path, "bundle"),
            python,
            folder.environment,
            sessions=self.bounds(source)[1],
            reply_tool=source.reply_tool,
            expected=expected,
        )

    async def inspect(self, given: str, options: WriteOptions) -> Source | None:
        folder = Path(given)
        if is_url(given) or not folder.is_dir() or (folder / ENTRY).is_file() or not is_agent_env_bundle(folder):
            return None
        refuse_url_options(given, options)
        bundle, python = folder.resolve(), agent_env_python(options.python)
        settings = PoolSettings()
        try:
            async with running_app(bundle, python, settings) as app:
                api = TaskApi(app.url, timeout=settings.data_timeout_s, uds=app.socket)
                try:
                    environments = await api.environments()
                    if environments is None:
                        raise SourceError(f"{bundle}: agent-env's app for it serves no OpenEnv Task API")
                    source = await _inspect_server(self.kind, self, api, environments, options, uds=app.socket)
                finally:
                    await api.aclose()
        except StartupError as error:
            raise SourceError(str(error)) from None
        source.bundle, source.python, source.urls = bundle, python, []
        return source

    def source_fields(self, source: Source, instances: tuple[int, int], mode: str) -> list[tuple[str, Any, str]]:
        assert source.bundle is not None
        return [
            ("kind", self.kind, ""),
            ("path", json.dumps(f"bundle/{source.bundle.name}"), ""),
            ("python", json.dumps(source.python), _PYTHON_COMMENT),
            ("instances", instances[0], _SESSIONS_COMMENT),
            ("max_instances", instances[1], "the most episodes at once: the app's max_concurrent_envs"),
            ("reply_tool", json.dumps(source.reply_tool), _REPLY_TOOL_COMMENT),
        ]

    def copy_into(self, source: Source, folder: Path) -> str:
        assert source.bundle is not None
        # under its own name, which is agent-env's name for the environment
        shutil.copytree(source.bundle, folder / "bundle" / source.bundle.name, ignore=IGNORED)
        return super().copy_into(source, folder)

    def what_it_does(self) -> str:
        return """The server runs agent-env's own OpenEnv app for the bundle in `bundle/` for as long as it lives, with
the Python `source.python` names (a venv with `agentenv-framework[openenv]`; `--set source.python=...` at serve time
names another), on a private Unix socket. Each episode is one of its sessions: `/seed_session` resets it to the row's
task, whose turn the model plays; each tool route (`POST /<tool>`) is a call of the turn's tools (a tool the turn does
not have answers 400 with agent-env's message), `end_turn` hands the model's reply back (the next turn's prompt, or
the end); `/verify` ends a turn still open with the response's final assistant text, ends any later turn with no
reply, and answers agent-env's reward. An episode agent-env could not run (a deploy, a verifier or a reward that
failed) is a masked sample, never a 0.0."""


OPENENV = OpenEnvBackend()
AGENT_ENV = AgentEnvFrameworkBackend()
