"""An OpenEnv server's Task API (HTTP): the environments it serves, their splits and tasks, which ``gymhost write``
reads (``_tasks``), and which a written agent-env server checks at start (``_agent_env``)."""

from __future__ import annotations

from typing import Any

import httpx

from .._errors import EnvUnavailableError, SourceError

__all__ = ["TaskApi"]


class TaskApi:
    """An OpenEnv server's Task API, which ``gymhost write`` reads the environment's splits and tasks from."""

    def __init__(self, base_url: str, *, timeout: float, uds: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        transport = httpx.AsyncHTTPTransport(uds=uds) if uds is not None else None
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)

    async def environments(self) -> list[str] | None:
        """The environments the server names, or None when it has no Task API (it is not an OpenEnv server);
        ``EnvUnavailableError`` when nothing answers at all."""
        try:
            response = await self._http.get("/list_environments")
        except httpx.TransportError as error:
            raise EnvUnavailableError(f"{self.base_url}: nothing answered: {error!r}") from None
        if response.status_code != 200:
            return None
        try:
            names = response.json()
        except ValueError:
            return None
        if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
            return None
        return names

    async def splits(self, environment: str) -> list[str]:
        answer = await self._get_json("GET", f"/{environment}/splits")
        if not isinstance(answer, list):
            raise SourceError(f"{self.base_url}/{environment}/splits answered no list of splits")
        names = [split.get("name") if isinstance(split, dict) else split for split in answer]
        if not names or not all(isinstance(name, str) and name for name in names):
            raise SourceError(f"{self.base_url}/{environment}/splits answered no split names: {answer!r:.200}")
        return [str(name) for name in names]

    async def tasks(self, environment: str, split: str) -> list[Any]:
        answer = await self._get_json("POST", f"/{environment}/tasks", json={"split": split})
        tasks = answer.get("tasks") if isinstance(answer, dict) else None
        if not isinstance(tasks, list):
            raise SourceError(f"{self.base_url}/{environment}/tasks answered no tasks list for split {split!r}")
        return tasks

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get_json(self, method: str, path: str, **kwargs: Any) -> Any:
        where = f"{self.base_url}{path}"
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise SourceError(f"{where}: {error!r}") from None
        if response.status_code == 501:
            raise SourceError(f"{where}: the OpenEnv environment has no tasks of its own (its Task API answers 501)")
        if response.status_code != 200:
            raise SourceError(f"{where} answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError:
            raise SourceError(f"{where} answered something that is not JSON") from None
