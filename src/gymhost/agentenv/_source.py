"""What ``gymhost write`` writes from: a bundle folder, or the URLs of running environment instances.

Either way the card comes from a live environment (a bundle is started once, on loopback, to ask it), so what is
written is what the server will find when it starts: the tools, the hidden ones, and the grade extensions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._catalog import check_tasks, policy_tools
from ._config import PoolSettings
from ._env_client import EnvClient
from ._exceptions import DataPlaneError, EnvUnavailableError, SourceError
from ._launchers import ENTRY
from ._pool import Pool
from ._processes import BundleLauncher
from ._tasks import Task, load_task_folder, load_tasks

__all__ = ["Source", "inspect_source"]


@dataclass
class Source:
    kind: Literal["bundle", "urls"]
    card: dict[str, Any]
    tools: list[dict[str, Any]]
    tasks: dict[str, list[Task]]
    task_files: dict[str, Path]
    bundle: Path | None = None
    urls: list[str] = field(default_factory=list)

    @property
    def environment(self) -> str:
        return str(self.card["name"])


async def inspect_source(
    source: str, *, extra_urls: Sequence[str] = (), tasks_file: Path | None = None, split: str | None = None
) -> Source:
    """Resolve SOURCE, validate its tasks, and read its card from a live instance."""
    if source.startswith(("http://", "https://")):
        if tasks_file is None:
            raise SourceError(f"{source}: an environment URL has no tasks of its own; give them with --tasks FILE")
        return await _inspect_urls([source, *extra_urls], tasks_file, split)
    if extra_urls:
        raise SourceError("--url adds instances to an environment URL source; a bundle starts its own instances")
    if tasks_file is not None:
        raise SourceError(f"{source}: --tasks is for URL sources; a bundle's tasks are in its tasks/ folder")
    return await _inspect_bundle(Path(source), split)


async def _inspect_bundle(folder: Path, split: str | None) -> Source:
    if not folder.is_dir():
        raise SourceError(f"{folder}: not an http(s) URL and no such folder; expected a bundle or an environment URL")
    bundle = folder.resolve()
    if not (bundle / ENTRY).is_file():
        raise SourceError(f"{bundle}: no {ENTRY}; a bundle holds one AgentEnvEnvironment subclass in {ENTRY}")
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


def _checked(source: Source, hidden: set[str]) -> Source:
    source.tools = policy_tools(source.card, hidden)
    check_tasks(
        {str(source.task_files[name]): tasks for name, tasks in source.tasks.items()},
        source.card,
        [tool["name"] for tool in source.tools],
        hidden,
    )
    return source
