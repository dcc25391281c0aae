"""The episode load generator: runs in its own process, on aiohttp with keep-alive connections, prints one JSON
object with what it measured.

    python loadgen.py episodes URL ROWS.jsonl --task long-corridor --concurrency 64 --episodes 640 [--looks 4]
    python loadgen.py mcp ENV_URL --concurrency 64 --calls 2560
    python loadgen.py openenv OPENENV_URL --concurrency 16 --calls 640
    python loadgen.py hold URL ROWS.jsonl --task long-corridor --pid SERVER_PID --levels 100,250,500,750,1000
    python loadgen.py think URL ROWS.jsonl --pid SERVER_PID --episodes 256 --think 0.5 --calls 4
    python loadgen.py burst URL ROWS.jsonl --seeds 200

``episodes``: each worker plays whole episodes against a written gridsim server, the way a trainer does (seed with
the row, keep its cookie, tool calls, verify), and times every call (``--new-connections``: each request on a
connection of its own, as verifiers sends them). ``mcp``: each worker opens one MCP session
directly on an environment instance and makes tool calls: the same tool calls without gymhost in between.
``openenv``: the same for an OpenEnv server, each worker one session over its ``/ws`` (``look`` steps).
``hold``: opens episodes and keeps them open, level by level, reading the server's resident memory and timing one
tool call on every open episode at each level; then verifies them all. ``think``: that many episodes at once, each
waiting (a model's latency) before each of its tool calls, the way a training batch holds instances; watches the
pool's size and the resident memory of the server and its instance processes. ``burst``: that many seeds at once,
each episode verified as soon as it is seeded; the time until the last seed answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ACCEPT = "application/json, text/event-stream"


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "count": len(ordered),
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def response_object(calls: list[tuple[str, dict[str, Any], str]]) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    for index, (name, arguments, text) in enumerate(calls, 1):
        output.append(
            {"type": "function_call", "call_id": f"c{index}", "name": name, "arguments": json.dumps(arguments)}
        )
        output.append({"type": "function_call_output", "call_id": f"c{index}", "output": text})
    return {"id": "r", "object": "response", "created_at": 0, "model": "loadgen", "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip


class Episode:
    def __init__(self, http: aiohttp.ClientSession, url: str, row: dict[str, Any]) -> None:
        self.http, self.url, self.row = http, url, row
        self.cookie = ""
        self.calls: list[tuple[str, dict[str, Any], str]] = []

    async def seed(self) -> None:
        async with self.http.post(f"{self.url}/seed_session", json=self.row) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"seed answered {response.status}")
            self.cookie = "; ".join(f"{m.key}={m.value}" for m in response.cookies.values())

    async def tool(self, name: str, arguments: dict[str, Any]) -> None:
        async with self.http.post(f"{self.url}/{name}", json=arguments, headers={"Cookie": self.cookie}) as response:
            text = await response.text()
            if response.status != 200:
                raise RuntimeError(f"{name} answered {response.status}: {text[:200]}")
        self.calls.append((name, arguments, text))

    async def verify(self) -> dict[str, Any]:
        body = {**self.row, "response": response_object(self.calls)}
        async with self.http.post(f"{self.url}/verify", json=body, headers={"Cookie": self.cookie}) as response:
            answer: dict[str, Any] = await response.json()
            if response.status != 200 or answer.get("mask_sample"):
                raise RuntimeError(f"verify answered {response.status}: {answer.get('failure_reason')}")
            return answer


def session(concurrency: int, new_connections: bool = False) -> aiohttp.ClientSession:
    """``new_connections``: a connection for every request, as verifiers opens them (else kept alive)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency + 8, force_close=new_connections),
        cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=120),
    )  # fmt: skip


async def episodes(args: argparse.Namespace) -> dict[str, Any]:
    row = load_row(args.rows, args.task)
    moves = [("gridsim_move", {"direction": "up"})] * args.moves
    looks = [(args.look_tool, {})] * args.looks
    timings: dict[str, list[float]] = {"seed": [], "tool": [], "look": [], "verify": [], "episode": []}
    errors: list[str] = []
    remaining = args.episodes

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            episode = Episode(http, args.url, row)
            began = time.perf_counter()
            try:
                await timed(timings["seed"], episode.seed())
                for name, arguments in looks:
                    await timed(timings["look"], episode.tool(name, arguments))
                for name, arguments in moves:
                    await timed(timings["tool"], episode.tool(name, arguments))
                answer = await timed(timings["verify"], episode.verify())
                if answer["reward"] != args.expect_reward:
                    errors.append(f"reward {answer['reward']}")
            except Exception as error:  # counted, not fatal: errors are a result
                errors.append(repr(error)[:200])
                continue
            timings["episode"].append(time.perf_counter() - began)

    async with session(args.concurrency, args.new_connections) as http:
        began = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - began
    return {
        "concurrency": args.concurrency,
        "episodes": len(timings["episode"]),
        "episodes_per_s": round(len(timings["episode"]) / elapsed, 2),
        "errors": len(errors),
        "first_errors": errors[:3],
        **{name: percentiles(samples) for name, samples in timings.items()},
    }


async def direct_calls(concurrency: int, worker: Any, timings: list[float], errors: list[str]) -> dict[str, Any]:
    """Run ``concurrency`` workers that time tool calls made straight to an environment; what they measured."""
    async with session(concurrency) as http:
        began = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return {"concurrency": concurrency, "calls_per_s": round(len(timings) / elapsed, 1), "errors": len(errors),
            "first_errors": errors[:3], "look": percentiles(timings)}  # fmt: skip


async def mcp(args: argparse.Namespace) -> dict[str, Any]:
    """Tool calls straight to an environment over MCP, one session per worker."""
    timings: list[float] = []
    errors: list[str] = []
    remaining = args.calls
    url = f"{args.url}/mcp"

    async def rpc(http: aiohttp.ClientSession, headers: dict[str, str], message: dict[str, Any]) -> tuple[Any, Any]:
        async with http.post(url, json=message, headers=headers) as response:
            raw = await response.text()
            if response.status >= 400:
                raise RuntimeError(f"{message['method']} answered {response.status}")
            if "id" not in message:
                return None, response.headers
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                raw = next(line[5:].strip() for line in raw.splitlines() if line.startswith("data:"))
            return json.loads(raw), response.headers

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal remaining
        headers = {"Accept": ACCEPT}
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "loadgen", "version": "1"}}
        _, answer_headers = await rpc(
            http, headers, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
        )
        headers |= {"mcp-session-id": answer_headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        await rpc(http, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "gridsim_look", "arguments": {}}}
        while remaining > 0:
            remaining -= 1
            began = time.perf_counter()
            try:
                reply, _ = await rpc(http, headers, call)
                if reply.get("result", {}).get("isError") or "error" in reply:
                    raise RuntimeError(str(reply)[:200])
            except Exception as error:
                errors.append(repr(error)[:200])
                continue
            timings.append(time.perf_counter() - began)
        await http.delete(url, headers=headers)

    return await direct_calls(args.concurrency, worker, timings, errors)


async def openenv(args: argparse.Namespace) -> dict[str, Any]:
    """``look`` steps straight to an OpenEnv server, one session (WebSocket) per worker, reset to a task first."""
    timings: list[float] = []
    errors: list[str] = []
    remaining = args.calls
    step = {"type": "step", "data": {"type": "call_tool", "tool_name": "look", "arguments": {}}}

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal remaining
        async with http.ws_connect(f"{args.url.replace('http', 'ws', 1)}/ws", max_msg_size=0) as ws:
            await ws.send_json({"type": "reset", "data": {"split": "test", "index": 0}})
            await ws.receive_json()
            while remaining > 0:
                remaining -= 1
                began = time.perf_counter()
                await ws.send_json(step)
                reply = await ws.receive_json()
                if reply.get("type") != "observation" or reply["data"]["observation"].get("error"):
                    errors.append(str(reply)[:200])
                    continue
                timings.append(time.perf_counter() - began)
            await ws.send_json({"type": "close"})

    return await direct_calls(args.concurrency, worker, timings, errors)


async def hold(args: argparse.Namespace) -> dict[str, Any]:
    row = load_row(args.rows, args.task)
    limit = asyncio.Semaphore(args.batch)
    opened: list[Episode] = []
    seed_errors: list[str] = []
    report: dict[str, Any] = {"baseline_rss_mb": rss_mb(args.pid), "levels": []}

    async def open_one(http: aiohttp.ClientSession) -> None:
        episode = Episode(http, args.url, row)
        async with limit:
            try:
                await episode.seed()
            except Exception as error:
                seed_errors.append(repr(error)[:200])
                return
        opened.append(episode)

    async def look(episode: Episode, latencies: list[float], errors: list[str]) -> None:
        async with limit:
            began = time.perf_counter()
            try:
                await episode.tool("gridsim_look", {})
            except Exception as error:
                errors.append(repr(error)[:200])
                return
            latencies.append(time.perf_counter() - began)

    async def finish(episode: Episode, errors: list[str]) -> None:
        async with limit:
            try:
                await episode.verify()
            except Exception as error:
                errors.append(repr(error)[:200])

    async with session(args.batch) as http:
        for level in (int(level) for level in args.levels.split(",")):
            await asyncio.gather(*(open_one(http) for _ in range(level - len(opened))))
            await asyncio.sleep(0.5)
            rss = rss_mb(args.pid)
            latencies: list[float] = []
            call_errors: list[str] = []
            await asyncio.gather(*(look(episode, latencies, call_errors) for episode in opened))
            report["levels"].append({"open_episodes": len(opened), "rss_mb": rss, "seed_errors": len(seed_errors),
                                     "call_errors": len(call_errors), "look": percentiles(latencies)})  # fmt: skip
            if seed_errors or call_errors:
                report["first_errors"] = (seed_errors + call_errors)[:3]
                break
        verify_errors: list[str] = []
        await asyncio.gather(*(finish(episode, verify_errors) for episode in opened))
        report["verify_errors"] = len(verify_errors)
    return report


async def think(args: argparse.Namespace) -> dict[str, Any]:
    row = load_row(args.rows, args.task)
    seeds: list[float] = []
    errors: list[str] = []
    peak = {"instances": 0}
    done = asyncio.Event()
    # The memory of the whole tree is read when the last seed has been answered (every instance the batch grew is up
    # then: the pool stops none before instance_idle_s) and again after the batch, and the larger kept. Reading every
    # instance's smaps_rollup takes long enough that doing it as the batch arrived, in this loop, held up the seeds
    # it times; so it is read in a thread, and not before the seeds are over.
    seeded = [0]  # seeds answered, well or not
    memory: list[asyncio.Future[float]] = []

    async def watch(http: aiohttp.ClientSession) -> None:
        while not done.is_set():
            async with http.get(f"{args.url}/agentenv/pool") as response:
                status = await response.json()
            peak["instances"] = max(peak["instances"], len(status["instances"]))
            await asyncio.sleep(0.25)

    async def one(http: aiohttp.ClientSession) -> None:
        episode = Episode(http, args.url, row)
        try:
            try:
                await timed(seeds, episode.seed())
            finally:
                seeded[0] += 1
                if seeded[0] == args.episodes:
                    memory.append(asyncio.ensure_future(asyncio.to_thread(tree_rss_mb, args.pid)))
            for _ in range(args.calls):
                await asyncio.sleep(args.think)
                await episode.tool("gridsim_look", {})
            await episode.verify()
        except Exception as error:
            errors.append(repr(error)[:200])

    async with session(args.episodes) as http:
        watcher = asyncio.create_task(watch(http))
        began = time.perf_counter()
        await asyncio.gather(*(one(http) for _ in range(args.episodes)))
        elapsed = time.perf_counter() - began
        done.set()
        await watcher
    rss_mb = max([*[await reading for reading in memory], tree_rss_mb(args.pid)])
    return {"episodes": args.episodes, "think_s": args.think, "calls": args.calls, "errors": len(errors),
            "first_errors": errors[:3], "seconds": round(elapsed, 1), "seed": percentiles(seeds),
            "peak_instances": peak["instances"], "peak_rss_mb": round(rss_mb, 1)}  # fmt: skip


async def burst(args: argparse.Namespace) -> dict[str, Any]:
    row = load_row(args.rows, args.task)
    seeded_at: list[float] = []
    errors: list[str] = []

    async def one(http: aiohttp.ClientSession, began: float) -> None:
        episode = Episode(http, args.url, row)
        try:
            await episode.seed()
            seeded_at.append(time.perf_counter() - began)
            await episode.verify()
        except Exception as error:
            errors.append(repr(error)[:200])

    async with session(args.seeds) as http:
        began = time.perf_counter()
        await asyncio.gather(*(one(http, began) for _ in range(args.seeds)))
    return {"seeds": args.seeds, "seeded": len(seeded_at), "errors": len(errors), "first_errors": errors[:3],
            "last_seed_s": round(max(seeded_at, default=0.0), 2),
            "median_seed_s": round(statistics.median(seeded_at), 2) if seeded_at else None}  # fmt: skip


def tree_rss_mb(pid: int) -> float:
    """The memory of a process and all its descendants (a server, its template process and the instances forked
    from it), as proportional set sizes: a page several processes share counts once, split between them."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    tree, frontier = {pid}, [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree.update(frontier)
    total = 0.0
    for member in tree:
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) / 1024
        except PermissionError:  # a server is not dumpable: only root reads its memory map
            raise SystemExit(f"loadgen: /proc/{member}/smaps_rollup: run the benchmarks as root") from None
        except OSError:  # gone meanwhile
            continue
    return total


async def timed(samples: list[float], work: Any) -> Any:
    began = time.perf_counter()
    result = await work
    samples.append(time.perf_counter() - began)
    return result


def load_row(path: str, task: str) -> dict[str, Any]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    return next(row for row in rows if row["task_id"] == task)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    play = sub.add_parser("episodes")
    play.add_argument("url")
    play.add_argument("rows")
    play.add_argument("--task", default="long-corridor")
    play.add_argument("--concurrency", type=int, default=1)
    play.add_argument("--episodes", type=int, default=100)
    play.add_argument("--moves", type=int, default=4)
    play.add_argument("--looks", type=int, default=0)
    play.add_argument("--look-tool", default="gridsim_look")
    play.add_argument("--expect-reward", type=float, default=0.0)
    play.add_argument("--new-connections", action="store_true", help="a connection per request, as verifiers")
    direct = sub.add_parser("mcp")
    direct.add_argument("url")
    direct.add_argument("--concurrency", type=int, default=1)
    direct.add_argument("--calls", type=int, default=1000)
    over_ws = sub.add_parser("openenv")
    over_ws.add_argument("url")
    over_ws.add_argument("--concurrency", type=int, default=1)
    over_ws.add_argument("--calls", type=int, default=1000)
    keep = sub.add_parser("hold")
    keep.add_argument("url")
    keep.add_argument("rows")
    keep.add_argument("--task", default="long-corridor")
    keep.add_argument("--pid", type=int, required=True)
    keep.add_argument("--levels", default="100,250,500,750,1000")
    keep.add_argument("--batch", type=int, default=64)
    pace = sub.add_parser("think")
    pace.add_argument("url")
    pace.add_argument("rows")
    pace.add_argument("--task", default="long-corridor")
    pace.add_argument("--pid", type=int, required=True)
    pace.add_argument("--episodes", type=int, default=256)
    pace.add_argument("--think", type=float, default=0.5)
    pace.add_argument("--calls", type=int, default=4)
    cold = sub.add_parser("burst")
    cold.add_argument("url")
    cold.add_argument("rows")
    cold.add_argument("--task", default="long-corridor")
    cold.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    run = {"episodes": episodes, "mcp": mcp, "openenv": openenv, "hold": hold, "think": think, "burst": burst}
    json.dump(asyncio.run(run[args.mode](args)), sys.stdout)


if __name__ == "__main__":
    main()
