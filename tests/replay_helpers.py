"""Replaying a rollout Gym itself recorded (a line of a folder's ``data/example_rollouts.jsonl``) through gymhost, with
the requests Gym's own agents send, and comparing the reward with the recorded one.

A rollout line is the verify response Gym's agent returned: the request (the dataset row, the model's ``response``)
plus the reward and the verifier's own fields. Replayed, as ``responses_api_agents/simple_agent`` plays it:

1. the input row: the materialized input with the same ``(_ng_task_index, _ng_rollout_index)``
   (``data/example_rollouts_materialized_inputs.jsonl``, which Gym's own ``reverify`` pairs the same way), else the
   ``data/example.jsonl`` row at ``_ng_task_index`` whose input is the rollout's, else the first example row with
   that input, else the rollout line without the verifier's fields;
2. ``POST /seed_session`` with it, on a client that keeps every cookie (Gym's agent merges each answer's);
3. each ``function_call`` of the recorded ``response.output``, in order: ``POST /<name>`` with its parsed arguments
   (nemo-gym 0.4.0's MCP-only tools over the seed's ``mcp``), skipped when the arguments are not JSON, as Gym skips
   it, or when the server has no such tool (a tool of the agent's own, which Gym never sent to the server);
4. ``POST /verify`` with the row and the recorded ``response``.

A Gymnasium-style server (``/reset`` and ``/step``, ``responses_api_agents/gymnasium_agent``) is reset with the row,
then stepped with each model turn of the recorded output (a turn ends at an output the agent added: a tool's output
or an observation) until it terminates or truncates; the reward is the sum of the steps'.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROLLOUTS = "data/example_rollouts.jsonl"
MATERIALIZED = "data/example_rollouts_materialized_inputs.jsonl"
EXAMPLES = "data/example.jsonl"
_NOT_TOOLS = frozenset({"seed_session", "verify", "close_session", "aggregate_metrics", "reset", "step", "close"})
_RESPONSE_DEFAULTS: dict[str, Any] = {"created_at": 0, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


@dataclass
class Replayed:
    position: int
    reward: Any
    recorded: Any
    mask_sample: bool = False
    recorded_mask: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return same_reward(self.reward, self.recorded) and self.mask_sample == self.recorded_mask

    def __str__(self) -> str:
        mask = f", mask_sample {self.mask_sample} vs recorded {self.recorded_mask}" if self.mask_sample else ""
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"row {self.position}: reward {self.reward!r} vs recorded {self.recorded!r}{mask}{notes}"


def jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def rollouts(folder: Path, limit: int) -> list[dict[str, Any]]:
    return [row for row in jsonl(folder / ROLLOUTS) if isinstance(row.get("response"), dict)][:limit]


def _keys_of(rollout: dict[str, Any]) -> dict[str, Any]:
    return {name: rollout[name] for name in ("agent_ref", "_ng_task_index", "_ng_rollout_index") if name in rollout}


def same_reward(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-6)
    except (TypeError, ValueError):
        return bool(a == b)


class InputRows:
    """The row Gym sent for each rollout."""

    def __init__(self, folder: Path, verifier_fields: set[str]) -> None:
        self.materialized = {
            (row.get("_ng_task_index"), row.get("_ng_rollout_index")): row for row in jsonl(folder / MATERIALIZED)
        }
        self.examples = jsonl(folder / EXAMPLES)
        self.verifier_fields = verifier_fields

    def of(self, rollout: dict[str, Any]) -> dict[str, Any]:
        key = (rollout.get("_ng_task_index"), rollout.get("_ng_rollout_index"))
        if key in self.materialized:
            return _copy(self.materialized[key])
        wanted = _input(rollout)
        index = rollout.get("_ng_task_index")
        at_index = self.examples[index] if isinstance(index, int) and 0 <= index < len(self.examples) else None
        if at_index is not None and (_input(at_index) == wanted or not wanted):
            return self._with_keys(at_index, rollout)
        for row in self.examples:
            if _input(row) == wanted:
                return self._with_keys(row, rollout)
        skipped = {"response", "reward"} | self.verifier_fields
        return {
            key: value for key, value in rollout.items() if key not in skipped and not key.startswith("_ng_failure")
        }

    @staticmethod
    def _with_keys(row: dict[str, Any], rollout: dict[str, Any]) -> dict[str, Any]:
        """The example row, with the keys rollout collection adds (Gym sends them along)."""
        return _copy(row) | _keys_of(rollout)


async def replay_simple(
    client: httpx.AsyncClient, rollout: dict[str, Any], row: dict[str, Any], position: int
) -> Replayed:
    """Seed, the recorded tool calls, verify: one rollout, as Gym's simple agent plays it."""
    result = Replayed(position, None, rollout.get("reward"), recorded_mask=bool(rollout.get("mask_sample", False)))
    seeded = await client.post("/seed_session", json=row)
    if seeded.status_code >= 400:
        result.notes.append(f"seed_session {seeded.status_code}: {seeded.text[:300]}")
        return result
    seed_answer = seeded.json() if seeded.headers.get("content-type", "").startswith("application/json") else {}
    async with contextlib.AsyncExitStack() as stack:
        mcp: Any = None
        for call in _function_calls(rollout["response"]):
            name = str(call.get("name") or "")
            try:
                arguments = json.loads(call.get("arguments") or "")
            except (json.JSONDecodeError, TypeError):
                continue  # Gym's agent answers the model with an error and calls nothing
            if name in _NOT_TOOLS:
                continue
            answer = await client.post(f"/{name}", json=arguments)
            if answer.status_code == 404 and answer.text == '{"detail":"Not Found"}':  # no such route
                if isinstance(seed_answer, dict) and isinstance(seed_answer.get("mcp"), dict):
                    mcp = mcp or await _mcp_session(stack, client, seed_answer["mcp"])  # nemo-gym 0.4.0's MCP tools
                    await mcp.call_tool(name, arguments)
                else:
                    result.notes.append(f"no tool {name} on the server (an agent-side tool)")
    body = row | {"response": rollout["response"]}
    for name in ("deliverables_dir", "reference_ids"):
        if name in rollout:
            body[name] = rollout[name]
    verified = await client.post("/verify", json=body)
    if verified.status_code == 422:
        mended = _mended(body, verified.json())
        if mended is not None:
            result.notes.append("the recording's format mended (an older Gym's)")
            verified = await client.post("/verify", json=mended)
    if verified.status_code >= 400:
        result.notes.append(f"verify {verified.status_code}: {verified.text[:300]}")
        return result
    answer = verified.json()
    result.reward, result.mask_sample = answer.get("reward"), bool(answer.get("mask_sample", False))
    if result.mask_sample:
        result.notes.append(str(answer.get("failure_reason"))[:300])
    return result


async def replay_gymnasium(
    client: httpx.AsyncClient, rollout: dict[str, Any], row: dict[str, Any], position: int
) -> Replayed:
    """Reset, then a step per model turn until the environment terminates or truncates; the sum of the rewards."""
    result = Replayed(position, None, rollout.get("reward"))
    reset = await client.post("/reset", json=row)
    if reset.status_code >= 400:
        result.notes.append(f"reset {reset.status_code}: {reset.text[:300]}")
        return result
    total = 0.0
    response = rollout["response"]
    for turn in _model_turns(response):
        step = await client.post("/step", json=row | {"response": response | {"output": turn}})
        if step.status_code >= 400:
            result.notes.append(f"step {step.status_code}: {step.text[:300]}")
            return result
        data = step.json()
        total += float(data.get("reward") or 0.0)
        if data.get("terminated") or data.get("truncated"):
            break
    if (reset.json().get("info") or {}).get("supports_explicit_close") is True:
        await client.post("/close", json={})
    result.reward = total
    return result


def plays_gymnasium(app_paths: set[str]) -> bool:
    return {"/reset", "/step"} <= app_paths and "/seed_session" not in app_paths


def _copy(row: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(row))
    return copied


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return json.dumps(content, sort_keys=True)


def _input(row: dict[str, Any]) -> list[tuple[Any, str]]:
    value = (row.get("responses_create_params") or {}).get("input")
    if isinstance(value, str):
        return [("user", value)]
    return [
        (item.get("role") or item.get("type"), _text(item.get("content", item.get("output"))))
        for item in value or []
        if isinstance(item, dict)
    ]


def _function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        item for item in response.get("output") or [] if isinstance(item, dict) and item.get("type") == "function_call"
    ]


def _model_turns(response: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The outputs of each model call in a gymnasium agent's accumulated output."""
    turns: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        added_by_agent = item.get("type") == "function_call_output" or (
            item.get("role") == "user" and item.get("type", "message") == "message"
        )
        if added_by_agent:
            if current:
                turns.append(current)
                current = []
        else:
            current.append(item)
    if current:
        turns.append(current)
    return turns


async def _mcp_session(stack: contextlib.AsyncExitStack, client: httpx.AsyncClient, meta: dict[str, Any]) -> Any:
    """The MCP session tools go over when the seed answers ``mcp`` (nemo-gym 0.4.0's MCP servers), as verifiers
    joins ``url_path`` onto the server's URL."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    url = f"{str(client.base_url).rstrip('/')}/{str(meta.get('url_path', '/mcp')).lstrip('/')}"
    http = await stack.enter_async_context(
        httpx.AsyncClient(transport=client._transport, headers=meta.get("headers") or {})
    )
    read, write, _ = await stack.enter_async_context(streamable_http_client(url, http_client=http))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


def _mended(body: dict[str, Any], answer: Any) -> dict[str, Any] | None:
    """A recording today's request models refuse for its format alone (an older Gym's, or a synthetic trace:
    chat-completions ``usage``, a response without ``created_at``, a null ``tool_choice``), mended; None when any
    other field is refused."""
    errors = answer.get("detail") if isinstance(answer, dict) else None
    if not isinstance(errors, list) or not errors:
        return None
    mended = _copy(body)
    for error in errors:
        where = [str(part) for part in error.get("loc", [])][1:]
        if where[:2] == ["response", "usage"]:
            mended["response"].pop("usage", None)
        elif len(where) == 2 and where[0] == "response" and where[1] in _RESPONSE_DEFAULTS:
            mended["response"][where[1]] = _RESPONSE_DEFAULTS[where[1]]
        elif where[:1] == ["responses_create_params"] and where[1:2] in (["tool_choice"], ["parallel_tool_calls"]):
            mended["responses_create_params"].pop(where[1], None)
        else:
            return None
    return mended
