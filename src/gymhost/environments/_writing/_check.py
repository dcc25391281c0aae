"""``gymhost check``: play every row of a written folder through its server, with the task's reference solution
and with an empty attempt, and say whether the grading holds up.

A task is sound when its reference solution scores 1.0 (unmasked) and doing nothing does not. The reference is the
task's own ``solution``, or one given in a solutions file (``--solutions``: JSON Lines of ``{"task_id", "split"?,
"tool_calls", "final_text"}``, for environments whose tasks carry none, as agent-env's do). The server runs
in-process (its real app and lifespan, the real environment instances) and every row is played through its HTTP
endpoints with the same client the demo and tests use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..._client import EpisodeClient
from ..._config import NO_TOKEN
from ..._hosting._app import HOSTED, create_app
from ..._hosting._lifespan import running_lifespan
from .._errors import CheckError
from .._tasks import Solution

__all__ = ["RowCheck", "check_folder", "format_report", "load_solutions"]

_BASE_URL = "http://gymhost.check"


@dataclass(frozen=True)
class RowCheck:
    split: str
    task_id: str
    reference: dict[str, Any] | None  # the verify answer, or None when the task has no reference solution
    empty: dict[str, Any]

    @property
    def problems(self) -> list[str]:
        found = []
        if self.reference is not None and self.reference.get("mask_sample"):
            found.append(
                f"reference masked: {self.reference.get('failure_kind')}: {self.reference.get('failure_reason')}"
            )
        elif self.reference is not None and self.reference["reward"] != 1.0:
            failed = [c["detail"] for c in self.reference.get("criteria", []) if c["score"] < 1.0]
            found.append(f"reference scored {self.reference['reward']:g}: {'; '.join(failed)}")
        if self.empty.get("mask_sample"):
            found.append(f"empty attempt masked: {self.empty.get('failure_kind')}: {self.empty.get('failure_reason')}")
        elif self.empty["reward"] >= 1.0:
            found.append("an empty attempt scored 1.0: the grading does not need the task to be done")
        return found


def check_folder(
    folder: str | Path,
    solutions: dict[tuple[str | None, str], Solution] | None = None,
    *,
    started: Callable[[int], None] | None = None,
    checked: Callable[[RowCheck], None] | None = None,
) -> list[RowCheck]:
    """Every row checked; ``solutions`` (``load_solutions``) are references for tasks that have none, by (split,
    task id), a split of None meaning any. ``started`` hears how many rows there are once the server is up, and
    ``checked`` each row's check as it ends (in the order they end): what ``gymhost check`` shows progress with."""
    return asyncio.run(_check(Path(folder), solutions or {}, started or _nothing, checked or _nothing))


def _nothing(*_: Any) -> None:
    return None


def load_solutions(path: Path) -> dict[tuple[str | None, str], Solution]:
    """A solutions file: one ``{"task_id", "split"?, "tool_calls"?, "final_text"?}`` per line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise CheckError(f"{path}: cannot read the solutions file: {error.strerror or error}") from None
    found: dict[tuple[str | None, str], Solution] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            task_id, split = raw.pop("task_id"), raw.pop("split", None)
            if not isinstance(task_id, str) or not (split is None or isinstance(split, str)):
                raise ValueError("task_id (and split) must be strings")
            found[(split, task_id)] = Solution.model_validate(raw)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckError(
                f"{path}:{number}: not a solution ({{task_id, split?, tool_calls, final_text}}): {error}"
            ) from None
    if not found:
        raise CheckError(f"{path}: no solutions; expected one JSON object per line")
    return found


async def _check(
    folder: Path,
    solutions: dict[tuple[str | None, str], Solution],
    started: Callable[[int], None],
    checked: Callable[[RowCheck], None],
) -> list[RowCheck]:
    from .._server import WrittenResourcesServer

    app = create_app(folder, token=NO_TOKEN)  # played in-process: no request crosses the network
    hosted = HOSTED.get(app)
    server = hosted.server if hosted is not None else None
    if not isinstance(server, WrittenResourcesServer):
        raise CheckError(f"{folder}: its server is {type(server).__name__}, not one `gymhost write` wrote")
    rows = [
        (path.stem, json.loads(line))
        for path in sorted((folder / "data").glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    if not rows:
        raise CheckError(f"{folder / 'data'}: no rows to play")
    async with running_lifespan(app):
        transport = httpx.ASGITransport(app=app)
        runtime = server._running()
        limit = asyncio.Semaphore(runtime.status()["limits"]["min_instances"])  # the instances always up

        known = {(name, task.id) for name, tasks in runtime.tasks.items() for task in tasks}
        unknown = [key for key in solutions if key not in known and not any(key[1] == t for _, t in known)]
        if unknown:
            raise CheckError(f"the solutions name tasks this folder does not have: {', '.join(t for _, t in unknown)}")

        async def check_row(split: str, row: dict[str, Any]) -> RowCheck:
            split, task = runtime.find_task(row.get("split") or split, row["task_id"])
            solution = solutions.get((split, task.id)) or solutions.get((None, task.id)) or task.solution
            async with limit:
                reference = None
                if solution is not None:
                    calls = [(call.name, call.arguments) for call in solution.tool_calls]
                    reference = await _play(transport, row, calls, solution.final_text)
                empty = await _play(transport, row, [], "")
            done = RowCheck(split, task.id, reference, empty)
            checked(done)
            return done

        started(len(rows))
        return list(await asyncio.gather(*(check_row(split, row) for split, row in rows)))


async def _play(
    transport: httpx.AsyncBaseTransport, row: dict[str, Any], calls: list[tuple[str, dict[str, Any]]], final_text: str
) -> dict[str, Any]:
    async with EpisodeClient(_BASE_URL, transport=transport) as episode:
        try:
            await episode.seed(row)
            for name, arguments in calls:
                await episode.call_tool(name, arguments)
            return await episode.verify(row, final_text)
        except httpx.HTTPStatusError as error:  # a seed the server refused (its 503 names the failure), or a masked
            return _refused(error)  # verdict refused (middleware.masked_verdicts), which carries its verdict


def _refused(error: httpx.HTTPStatusError) -> dict[str, Any]:
    try:
        body = error.response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("verdict"), dict) and body["verdict"].get("mask_sample"):
        verdict: dict[str, Any] = body["verdict"]
        return verdict
    if isinstance(body, dict) and "failure_kind" in body:
        kind, reason = str(body["failure_kind"]), str(body.get("detail"))
    else:
        kind = "request_failed"
        reason = f"{error.request.url.path} answered HTTP {error.response.status_code}: {error.response.text[:300]}"
    return {"reward": 0.0, "mask_sample": True, "failure_kind": kind, "failure_reason": reason}


def format_report(checks: list[RowCheck]) -> str:
    """A table: one line per row, then the problems, if any."""
    width = max([len(f"{c.split}:{c.task_id}") for c in checks] + [4])
    lines = [f"{'task':<{width}}  reference  empty  result", f"{'-' * width}  ---------  -----  ------"]
    for check in checks:
        reference = "-" if check.reference is None else _reward(check.reference)
        result = "ok" if not check.problems else "FAIL"
        lines.append(
            f"{check.split + ':' + check.task_id:<{width}}  {reference:>9}  {_reward(check.empty):>5}  {result}"
        )
    for check in checks:
        lines += [f"{check.split}:{check.task_id}: {problem}" for problem in check.problems]
    missing = [f"{c.split}:{c.task_id}" for c in checks if c.reference is None]
    if len(missing) == len(checks):
        lines.append(
            "nothing was checked: no task has a reference solution (give them with --solutions FILE); only that an "
            "empty attempt does not score 1.0"
        )
    elif missing:
        lines.append(f"no reference solution (not checked): {', '.join(missing)}")
    return "\n".join(lines)


def _reward(answer: dict[str, Any]) -> str:
    return "masked" if answer.get("mask_sample") else f"{answer['reward']:.2f}"
