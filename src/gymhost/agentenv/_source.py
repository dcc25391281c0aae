"""What ``gymhost write`` writes from: a bundle folder (gymhost's: an agentenv-protocol ``env.py`` with gymhost task
files), an agent-env bundle folder (agent-env's own format, served by its OpenEnv app), the URL of an OpenEnv server,
or the URLs of running agentenv environment instances.

Either way the card comes from a live environment (a bundle is started once, on loopback, to ask it; an OpenEnv
server is asked for its tools over a session), so what is written is what the server will find when it starts: the
tools, the hidden ones, and the grade extensions. A URL is an OpenEnv server when its Task API names environments
(``GET /list_environments``); its tasks come from that API, unless ``--tasks`` gives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._agent_env import agent_env_python, is_agent_env_bundle, running_app
from ._catalog import card_tools, check_tasks, server_tools
from ._config import PoolSettings
from ._env_client import EnvClient
from ._exceptions import DataPlaneError, EnvUnavailableError, SourceError, StartupError
from ._launchers import ENTRY
from ._openenv import OpenEnvLauncher, TaskApi
from ._openenv_tasks import openenv_tasks
from ._pool import Pool
from ._processes import BundleLauncher
from ._tasks import Task, load_task_folder, load_tasks

__all__ = ["Source", "inspect_source", "reply_tool"]

_END_TURN = "end_turn"


@dataclass
class Source:
    kind: Literal["bundle", "urls", "openenv", "agent_env"]
    card: dict[str, Any]
    tools: list[dict[str, Any]]
    tasks: dict[str, list[Task]]
    task_files: dict[str, Path]
    bundle: Path | None = None
    urls: list[str] = field(default_factory=list)
    reply_tool: str | None = None  # OpenEnv: the tool that ends the model's turn with its reply (agent-env's end_turn)
    python: str | None = None  # an agent-env bundle: the interpreter that runs agent-env's app

    @property
    def environment(self) -> str:
        return str(self.card["name"])


async def inspect_source(
    source: str,
    *,
    extra_urls: Sequence[str] = (),
    tasks_file: Path | None = None,
    split: str | None = None,
    prompt_field: str | None = None,
    python: str | None = None,
) -> Source:
    """Resolve SOURCE, validate its tasks, and read its card from a live instance. ``python`` runs an agent-env
    bundle's app (``_agent_env.agent_env_python``)."""
    if python is not None and (source.startswith(("http://", "https://")) or (Path(source) / ENTRY).is_file()):
        raise SourceError(f"{source}: --python runs agent-env's app for an agent-env bundle; this is not one")
    if source.startswith(("http://", "https://")):
        api = TaskApi(source, timeout=PoolSettings().data_timeout_s)
        try:
            try:
                environments = await api.environments()
            except EnvUnavailableError as error:
                if tasks_file is None:
                    raise SourceError(str(error)) from None
                environments = None  # the agentenv card's probe below says what it meets
            if environments is not None:
                if extra_urls:
                    raise SourceError(f"{source}: an OpenEnv server is one URL; --url is for agentenv instances")
                return await _inspect_openenv(api, environments, tasks_file, split, prompt_field)
        finally:
            await api.aclose()
        if prompt_field is not None:
            raise SourceError(f"{source}: --prompt-field is for OpenEnv servers, whose tasks carry their prompts")
        if tasks_file is None:
            raise SourceError(
                f"{source}: not an OpenEnv server (GET /list_environments names no environment), and an agentenv "
                "environment has no tasks of its own: give them with --tasks FILE"
            )
        return await _inspect_urls([source, *extra_urls], tasks_file, split)
    if prompt_field is not None:
        raise SourceError(f"{source}: --prompt-field is for OpenEnv servers; a bundle's tasks hold their prompts")
    if extra_urls:
        raise SourceError("--url adds instances to an environment URL source; a bundle starts its own instances")
    if tasks_file is not None:
        raise SourceError(f"{source}: --tasks is for URL sources; a bundle's tasks are in its tasks/ folder")
    folder = Path(source)
    if folder.is_dir() and not (folder / ENTRY).is_file() and is_agent_env_bundle(folder):
        return await _inspect_agent_env(folder.resolve(), split, agent_env_python(python))
    return await _inspect_bundle(folder, split)


async def _inspect_bundle(folder: Path, split: str | None) -> Source:
    if not folder.is_dir():
        raise SourceError(f"{folder}: not an http(s) URL and no such folder; expected a bundle or an environment URL")
    bundle = folder.resolve()
    if not (bundle / ENTRY).is_file():
        raise SourceError(
            f"{bundle}: no {ENTRY}; a bundle holds one AgentEnvEnvironment subclass in {ENTRY} (gymhost's format), "
            "or tasks/<name>.json step lists (agent-env's)"
        )
    tasks = load_task_folder(bundle / "tasks")
    files = {name: bundle / "tasks" / f"{name}.jsonl" for name in tasks}
    if split is not None:
        if split not in tasks:
            raise SourceError(f"{bundle / 'tasks'}: no {split}.jsonl (splits: {', '.join(sorted(tasks))})")
        tasks, files = {split: tasks[split]}, {split: files[split]}
    pool = Pool(BundleLauncher(bundle), 1, 1, PoolSettings())  # one instance, with the limits a server has by default
    await pool.start()
    await pool.stop()
    return _checked(Source("bundle", pool.card, [], tasks, files, bundle=bundle), pool.hidden_tools)


async def _inspect_urls(urls: list[str], tasks_file: Path, split: str | None) -> Source:
    tasks = {split or tasks_file.stem: load_tasks(tasks_file)}
    files = {name: tasks_file.resolve() for name in tasks}
    clients = [EnvClient(url, data_timeout=PoolSettings().data_timeout_s) for url in urls]
    try:
        cards = []
        for client in clients:
            try:
                cards.append(await client.card())
            except (EnvUnavailableError, DataPlaneError) as error:
                raise SourceError(f"{client.base_url}: no environment card answered: {error}") from None
        names = {card["name"] for card in cards}
        if len(names) > 1:
            raise SourceError(f"the URLs serve different environments ({', '.join(sorted(names))}); a pool is one")
        hidden = await clients[0].hidden_tools(cards[0])
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))
    return _checked(Source("urls", cards[0], [], tasks, files, urls=[c.base_url for c in clients]), hidden)


async def _inspect_agent_env(bundle: Path, split: str | None, python: str) -> Source:
    """agent-env's app for the bundle, started for the write, read as an OpenEnv server is."""
    settings = PoolSettings()
    try:
        async with running_app(bundle, python, settings) as app:
            api = TaskApi(app.url, timeout=settings.data_timeout_s, uds=app.socket)
            try:
                environments = await api.environments()
                if environments is None:
                    raise SourceError(f"{bundle}: agent-env's app for it serves no OpenEnv Task API")
                source = await _inspect_openenv(api, environments, None, split, None, uds=app.socket)
            finally:
                await api.aclose()
    except StartupError as error:
        raise SourceError(str(error)) from None
    source.kind, source.bundle, source.python, source.urls = "agent_env", bundle, python, []
    return source


async def _inspect_openenv(
    api: TaskApi,
    environments: list[str],
    tasks_file: Path | None,
    split: str | None,
    prompt_field: str | None,
    *,
    uds: str | None = None,
) -> Source:
    if len(environments) != 1:
        raise SourceError(
            f"{api.base_url}: serves {len(environments)} environments ({', '.join(environments)}); "
            "gymhost writes a server for one"
        )
    launcher = OpenEnvLauncher(api.base_url, environments[0], uds=uds)
    try:
        card = await launcher.card(PoolSettings())
    except (EnvUnavailableError, DataPlaneError) as error:
        raise SourceError(f"{api.base_url}: the OpenEnv server's tools could not be listed over /ws: {error}") from None
    if tasks_file is not None:
        if prompt_field is not None:
            raise SourceError("--prompt-field reads the OpenEnv server's tasks; tasks from --tasks hold their prompts")
        tasks = {split or tasks_file.stem: load_tasks(tasks_file)}
        files = {name: tasks_file.resolve() for name in tasks}
    else:
        own_tools = not card_tools(card)  # its tools exist only inside an episode: each task's are read after its reset
        try:
            tasks = await openenv_tasks(api, launcher, split, prompt_field, own_tools=own_tools)
        except (EnvUnavailableError, DataPlaneError) as error:
            raise SourceError(f"{api.base_url}: reading the tasks' resets failed: {error}") from None
        files = {}
    source = _checked(Source("openenv", card, [], tasks, files, urls=[api.base_url]), set())
    source.reply_tool = reply_tool(source.tools)
    return source


def reply_tool(tools: list[dict[str, Any]]) -> str | None:
    """agent-env's ``end_turn`` (a tool of that name taking a ``response``), when the environment has it: the turn a
    model answers in its final message instead is ended with that message at verify."""
    for tool in tools:
        if tool.get("name") == _END_TURN and "response" in ((tool.get("inputSchema") or {}).get("properties") or {}):
            return _END_TURN
    return None


def _checked(source: Source, hidden: set[str]) -> Source:
    source.tools = server_tools(source.card, hidden, (task for tasks in source.tasks.values() for task in tasks))
    check_tasks(
        {str(source.task_files.get(name, f"task split {name!r}")): tasks for name, tasks in source.tasks.items()},
        source.card,
        [str(tool["name"]) for tool in card_tools(source.card) if tool.get("name") not in hidden],
        hidden,
    )
    return source
