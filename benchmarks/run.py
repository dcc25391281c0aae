"""`make bench`: every comparison measured side by side in one run, written to benchmarks/results/<date>.json and to
the table in benchmarks/README.md.

1. Tool calls on nemo-gym's example_single_tool_call (POST /get_weather with a seeded session's cookie), driven by
   wrk from its own process, at concurrency 1, 64 and 256, against: (a) a bare Starlette endpoint doing the same
   work (the practical limit), (b) the server as Gym's own launcher runs it (`python app.py` with Gym's config in
   the environment), (c) `gymhost serve` (uvicorn), (d) `gymhost serve --server hypercorn`, and, for reference,
   a plain FastAPI route with the same models and no middleware (FastAPI's floor, which every Gym server is on).
2. Episodes on the written gridsim server (in-process instances): seed, 4 tool calls, verify, from the load
   generator's process, at concurrency 1, 64, 256; against the same tool call made directly to a gridsim
   environment over MCP.
3. Open episodes held by one server process (in-process instances, started on demand), level by level up to
   10,000: resident memory, and one tool call on every open episode at each level.
4. Scale, on folders written with default options (the elastic pool): 256 episodes at once with a model's think
   time before each tool call; a cold burst of 200 seeds on a pool at its minimum (both instance modes); process
   mode at 64 concurrent episodes, with gymhost's own CPU time per bridged call; one instance start's time and CPU.
5. A cold think-time batch and one start, instances constructed once in the template against each its own.
6. Scale-out: `--workers 1` against `--workers 2` (tool calls and episodes), the cost of a request forwarded to the
   worker that holds its session, and three replicas behind HAProxy (deploy/haproxy/haproxy.cfg) against one alone.
7. Workers as verifiers loads them (a connection per request): CPU of the process tree per request and requests/s
   for `--workers 1`, `--workers 2` (connections handed to their owner) and `--workers 2 --no-hand-off` (forwarded).
8. An OpenEnv server's tool call through its written gymhost server; Gym's stated load (bursts of connections).
9. hypercorn's loops (`hypercorn_loops.py`), a written server's tool call against its bare endpoint
   (`written_calls.py`), a Gym server's tool call layer by layer, in-process (`layers.py`), and process mode
   beside in-process mode in interleaved rounds (`process_mode.py`).

Run it with the nemo-gym 0.7.0 venv's Python (`make bench` does); `--quick` shortens every measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from omegaconf import OmegaConf

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
CONCURRENCY = (1, 64, 256)
EXAMPLE = "example_single_tool_call"
PACKAGES = ("gymhost", "nemo-gym", "fastapi", "starlette", "uvicorn", "hypercorn", "httptools", "uvloop", "mcp",
            "agentenv-framework-protocol", "httpx", "aiohttp")  # fmt: skip


def in_turn[K, V](items: Mapping[K, V], round_number: int) -> list[tuple[K, V]]:
    """``items`` rotated by one place a round, so that over as many rounds as there are items each runs once in each
    place: two servers swap places every round. Measured here: of two servers measured back to back at one
    connection, the second ran 5 to 10% faster whichever it was (1,767 and 1,855 calls/s one way round, 1,685 and
    1,540 the other). Until 2026-12-03, every other round was the reverse order instead, which with three servers
    kept the middle one in the middle in every round."""
    pairs = list(items.items())
    shift = round_number % len(pairs) if pairs else 0
    return pairs[shift:] + pairs[:shift]


IDLE_S = 1.0  # a pool sent nothing for this long has settled: its template does once nothing comes for a tenth of one


def idle_pool(url: str) -> None:
    """Until the written server at ``url`` is ready (``/readyz``: its pool's minimum of instances serving), then sent
    nothing for ``IDLE_S``: a pool as a batch finds it between a training run's waves, its template settled
    (rehearsed and made immortal, ``_template._settle``, once nothing has come for a tenth of a second). Until
    2026-12-07 a batch was sent as soon as the server answered at all, when the template could still be settling."""
    if not _answers(url + "/readyz", 60, every_s=0.05):
        raise RuntimeError(f"{url} is not ready")
    time.sleep(IDLE_S)


def _answers(url: str, within_s: float, *, every_s: float, process: subprocess.Popen[bytes] | None = None) -> bool:
    """Whether ``url`` answers 200 within ``within_s``, asked every ``every_s`` (a transport error: asked again);
    a ``process`` that exits meanwhile raises."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        time.sleep(every_s)
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server(command: list[str], url: str, *, cwd: Path | None = None, env: dict[str, str] | None = None,
           ready: str = "/", startup_s: float = 180) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        if not _answers(url + ready, startup_s, every_s=0.2, process=process):
            raise RuntimeError(f"{command} did not answer at {url}")
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wrk(
    url: str, concurrency: int, seconds: int, cookie: str, *, timeout_s: int | None = None, body: str | None = None
) -> dict[str, Any]:
    """One wrk run; ``timeout_s`` beyond wrk's default 2 s counts slow requests in the latencies, not as errors;
    ``body``: the JSON posted (post.lua's default: get_weather's)."""
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--latency", "-s", str(HERE / "post.lua"), url]
    if timeout_s is not None:
        command[1:1] = ["--timeout", f"{timeout_s}s"]
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COOKIE": cookie, **({"BODY": body} if body is not None else {})},
    ).stdout
    latency = {q: _ms(v) for q, v in re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, flags=re.MULTILINE)}
    if set(latency) != {"50", "99"}:
        raise RuntimeError(f"unreadable wrk output:\n{out}")
    slowest = re.search(r"^[ \t]+Latency[ \t]+\S+[ \t]+\S+[ \t]+(\S+)", out, flags=re.MULTILINE)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "concurrency": concurrency,
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": latency["50"],
        "p99_ms": latency["99"],
        "max_ms": _ms(slowest.group(1)) if slowest else None,
        "errors": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": sum(int(n) for n in socket_errors.groups()) if socket_errors else 0,
    }


def _ms(value: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return round(float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit], 3)


def seed_cookie(url: str, row: dict[str, Any]) -> str:
    response = httpx.post(f"{url}/seed_session", json=row, timeout=30)
    response.raise_for_status()
    return "; ".join(f"{name}={value}" for name, value in response.cookies.items())


def gym_root() -> Path:
    import resources_servers

    return next(Path(p) for p in resources_servers.__path__ if (Path(p) / EXAMPLE).is_dir())


def gym_launcher_env(folder: Path, port: int) -> dict[str, str]:
    """What `gym env start` puts in a server's environment once its venv exists."""
    config = OmegaConf.to_container(OmegaConf.load(folder / "configs" / f"{EXAMPLE}.yaml"))
    assert isinstance(config, dict)
    block = config[EXAMPLE]["resources_servers"][EXAMPLE]
    block.update(host="127.0.0.1", port=port)
    global_config = {
        EXAMPLE: config[EXAMPLE],
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "dry_run": False,
    }
    return {
        "NEMO_GYM_CONFIG_DICT": OmegaConf.to_yaml(OmegaConf.create(global_config)),
        "NEMO_GYM_CONFIG_PATH": EXAMPLE,
        "PYTHONPATH": str(folder),
    }


def tool_calls(seconds: int, rounds: int) -> dict[str, Any]:
    """All servers up at once, measured in turn, round after round; each point is the median of its rounds, so a
    machine that slows down for a minute slows every server's numbers alike."""
    folder = gym_root() / EXAMPLE
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    gymhost = [PYTHON, "-m", "gymhost", "serve", str(folder), "--log-level", "warning"]
    servers = {
        "bare_starlette": lambda port: ([PYTHON, str(HERE / "bare_app.py"), str(port)], None, {}),
        "plain_fastapi": lambda port: ([PYTHON, str(HERE / "fastapi_app.py"), str(port)], None, {}),
        "gym_launcher": lambda port: ([PYTHON, "app.py"], folder, gym_launcher_env(folder, port)),
        "gymhost_uvicorn": lambda port: ([*gymhost, "--port", str(port)], None, {}),
        "gymhost_no_http_metrics": lambda port: ([*gymhost, "--port", str(port), "--no-http-metrics"], None, {}),
        "gymhost_hypercorn": lambda port: ([*gymhost, "--port", str(port), "--server", "hypercorn"], None, {}),
    }
    samples: dict[str, dict[int, list[dict[str, Any]]]] = {name: {c: [] for c in CONCURRENCY} for name in servers}
    with contextlib.ExitStack() as stack:
        targets = {}
        for name, spec in servers.items():
            port = free_port()
            command, cwd, env = spec(port)
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(server(command, url, cwd=cwd, env=env))
            cookie = seed_cookie(url, row) if name not in ("bare_starlette", "plain_fastapi") else ""
            wrk(f"{url}/get_weather", 16, 1, cookie)  # warm up
            targets[name] = (url, cookie)
        for number in range(rounds):
            for c in CONCURRENCY:
                for name, (url, cookie) in in_turn(targets, number):
                    samples[name][c].append(wrk(f"{url}/get_weather", c, seconds, cookie))
    results = {name: [_median_run(samples[name][c]) for c in CONCURRENCY] for name in servers}
    for name, rows in results.items():
        print(f"  tool calls, {name}: " + ", ".join(f"c={r['concurrency']} {r['rps']:.0f}/s" for r in rows))
    return results


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput, with every round's throughput and the errors of all rounds."""
    ordered = sorted(runs, key=lambda run: run["rps"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["rounds_rps"] = [run["rps"] for run in runs]
    chosen["errors"] = sum(run["errors"] for run in runs)
    chosen["socket_errors"] = sum(run["socket_errors"] for run in runs)
    return chosen


def write_gridsim(root: Path, instances: int | str | None, mode: str = "in-process") -> Path:
    """gridsim written as `gymhost write` writes it; ``instances`` None takes the mode's default (elastic)."""
    from gymhost.environments import write_folder

    return write_folder(str(REPO / "examples" / "gridsim_v1"), root, mode=mode, instances=instances).path


def gymhost_serve(folder: Path, port: int, *settings: str) -> list[str]:
    command = [PYTHON, "-m", "gymhost", "serve", str(folder), "--port", str(port), "--log-level", "warning"]
    for setting in settings:
        command += ["--set", setting]
    return command


def loadgen(*args: str) -> dict[str, Any]:
    out = subprocess.run([PYTHON, str(HERE / "loadgen.py"), *args], capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def episodes(root: Path, scale: float) -> dict[str, Any]:
    folder = write_gridsim(root, instances=300)
    rows = str(folder / "data" / "eval.jsonl")
    port, env_port = free_port(), free_port()
    url, env_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{env_port}"
    through: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    direct: list[dict[str, Any]] = []
    with server(gymhost_serve(folder, port), url):
        for c in CONCURRENCY:
            short = max(c, int((100 if c == 1 else 6 * c) * scale))
            through.append(loadgen("episodes", url, rows, "--concurrency", str(c), "--episodes", str(short),
                                   "--looks", "4", "--moves", "0"))  # fmt: skip
            # For the bridge's overhead, long episodes (40 tool calls): nearly every worker is in a tool call at any
            # moment, as every worker of the direct run is, so both sides carry the same load.
            long = max(c, int((10 if c == 1 else 2 * c) * scale))
            calls.append(loadgen("episodes", url, rows, "--concurrency", str(c), "--episodes", str(long),
                                 "--looks", "40", "--moves", "0"))  # fmt: skip
    env = {"MCP_HOST": "127.0.0.1", "MCP_PORT": str(env_port)}
    bundle = folder / "bundle"
    with server([PYTHON, str(bundle / "env.py")], env_url, cwd=bundle, env=env, ready="/.well-known/agent-env.json"):
        seed = {"kind": "data", "data": {"size": [1, 10], "start": [0, 0], "goal": [0, 9]}}
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "data/add", "params": {"parts": [seed]}}
        httpx.post(f"{env_url}/agentenv", json=rpc).raise_for_status()
        for c, played in zip(CONCURRENCY, calls, strict=True):
            direct.append(loadgen("mcp", env_url, "--concurrency", str(c), "--calls", str(played["look"]["count"])))
    for c, a, b, d in zip(CONCURRENCY, through, calls, direct, strict=True):
        print(f"  episodes c={c}: {a['episodes_per_s']}/s; tool call p50 {b['look']['p50_ms']} ms through gymhost, "
              f"{d['look']['p50_ms']} ms direct")  # fmt: skip
    return {"through_gymhost": through, "tool_calls_through_gymhost": calls, "direct_mcp": direct}


OPENENV_PYTHON = REPO / ".venv-openenv" / "bin" / "python"
OPENENV_SESSIONS = 16


def openenv_bridge(root: Path, scale: float) -> dict[str, Any]:
    """An OpenEnv server's tool call (``look``) through its written gymhost server, in episodes of 40 calls, against
    the same call made straight over its /ws by the same number of sessions: the OpenEnv bridge's overhead."""
    from gymhost.environments import write_folder

    port, env_port = free_port(), free_port()
    url, env_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{env_port}"
    sums = [str(OPENENV_PYTHON), str(REPO / "examples" / "openenv_sums" / "server.py"), "--port", str(env_port),
            "--max-sessions", str(OPENENV_SESSIONS), "--max-steps", "1000000"]  # fmt: skip
    through: list[dict[str, Any]] = []
    direct: list[dict[str, Any]] = []
    with server(sums, env_url, ready="/health"):
        folder = write_folder(env_url, root / "openenv", instances=OPENENV_SESSIONS).path
        rows = str(folder / "data" / "test.jsonl")
        with server(gymhost_serve(folder, port), url):
            for c in (1, OPENENV_SESSIONS):
                count = max(c, int((10 if c == 1 else 2 * c) * scale))
                through.append(loadgen("episodes", url, rows, "--task", "test-0", "--concurrency", str(c),
                                       "--episodes", str(count), "--looks", "40", "--moves", "0",
                                       "--look-tool", "look"))  # fmt: skip
        for c, played in zip((1, OPENENV_SESSIONS), through, strict=True):
            direct.append(loadgen("openenv", env_url, "--concurrency", str(c), "--calls", str(played["look"]["count"])))
    for a, d in zip(through, direct, strict=True):
        print(f"  openenv c={a['concurrency']}: tool call p50 {a['look']['p50_ms']} ms through gymhost, "
              f"{d['look']['p50_ms']} ms direct over /ws")  # fmt: skip
    return {"through_gymhost": through, "direct_ws": direct}


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def concurrency(root: Path, levels: str) -> dict[str, Any]:
    """Open episodes held by one process: the pool starts the in-process instances as the episodes come, so the
    memory an open episode costs is counted with its instance."""
    top = max(int(level) for level in levels.split(","))
    folder = write_gridsim(root / "hold", instances=f"50:{top + 50}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    with server(gymhost_serve(folder, port), url) as process:
        startup_s = round(time.monotonic() - began, 1)
        result = loadgen("hold", url, str(folder / "data" / "eval.jsonl"), "--pid", str(process.pid),
                         "--levels", levels, "--batch", "64")  # fmt: skip
    result["max_instances"] = top + 50
    result["startup_s"] = startup_s
    for level in result["levels"]:
        p99 = level["look"].get("p99_ms")
        print(f"  open episodes {level['open_episodes']}: {level['rss_mb']} MB, tool call p99 {p99} ms")
    return result


_TICK = os.sysconf("SC_CLK_TCK")


def process_times(pid: int) -> tuple[float, float, int]:
    """User and system CPU seconds and minor page faults of one process (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK, int(fields[7])


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of one process (not its children)."""
    user, system, _ = process_times(pid)
    return user + system


def cpu_seconds_precise(pid: int) -> float:
    """CPU time of one process's threads that are alive, in nanoseconds' precision (``schedstat``): a start's few
    milliseconds vanish in ``stat``'s clock ticks (10 ms each)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _descendants_cpu(pid: int) -> float:
    total = 0.0
    for child in tree(pid):
        with contextlib.suppress(OSError):  # one that ended meanwhile
            total += cpu_seconds(child)
    return total


def sixty_four(url: str, rows: str, pid: int, quick: bool) -> dict[str, Any]:
    """64 concurrent episodes of 40 tool calls, on a pool already grown to 64 (a process-mode folder's fresh
    instance an episode starts within the run, as in training: ``source.fresh_instances``); the CPU a request of the
    server's own process and of the rest of the machine (``_rest_cpu_s``: its instance processes, their starts and
    exits, the kernel's work), from /proc."""
    loadgen("episodes", url, rows, "--concurrency", "64", "--episodes", "64", "--looks", "1", "--moves", "0")
    calls = 64 if quick else 128
    before, before_rest = cpu_seconds(pid), _rest_cpu_s()
    played = loadgen("episodes", url, rows, "--concurrency", "64", "--episodes", str(calls), "--looks", "40",
                     "--moves", "0")  # fmt: skip
    used = cpu_seconds(pid) - before
    rest = _rest_cpu_s() - before_rest - used
    count = played["look"]["count"] + 2 * played["episodes"]  # tool calls, seeds and verifies
    played["gymhost_cpu_ms_per_request"] = round(used * 1000 / max(1, count), 3)
    played["instances_cpu_ms_per_request"] = round(max(0.0, rest) * 1000 / max(1, count), 3)
    played["instances_cpu_of"] = "the rest of the machine"  # earlier runs: the processes alive at its ends
    played["calls_per_s"] = round(played["episodes_per_s"] * 40, 1)  # 40 tool calls an episode
    return played


def _rest_cpu_s() -> float:
    """The machine's CPU seconds less those of the processes this one has waited for (the load generators): what a
    server and everything under it ran, with the kernel's work and whatever else the machine did. A server's instance
    processes are counted this way because /proc cannot count them: a fresh instance an episode ends with its episode,
    reaped by the kernel (its template ignores SIGCHLD), so its CPU is in no process's figures afterwards, and the
    processes alive at either end of a run are other instances than those that played it."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return machine_cpu_s() - children.ru_utime - children.ru_stime


def instance_starts(folder: Path, count: int, *, construct_once: bool = True, sandbox: str = "auto") -> dict[str, Any]:
    """``count`` process-mode instances started one after another by the launcher the pool uses (confined as
    ``sandbox`` says), each until it answers its card: ``instance_starts_in_turn``'s figures for one way."""
    ways = {"one": {"construct_once": construct_once, "sandbox": sandbox}}
    return instance_starts_in_turn(folder, count, ways)["one"]


def instance_starts_in_turn(folder: Path, count: int, ways: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``count`` process-mode instances of each way (``construct_once``, ``sandbox``) started by the launcher the pool
    uses, one after another, the ways in turn (one start of each, their order rotated each time: a noisy minute lands
    on every way), each start until it answers its card (asked again every 50 ms while it cannot be reached, as the
    pool asks); each way's template started and settled first. For each way: wall time a start (mean, median, p99),
    the CPU of each process involved a start (this one, the template, the instances, the sandbox's), and an idle
    instance's proportional set size (a confined one's keeper included), with all of them up."""
    import asyncio

    from gymhost._confinement import confinement
    from gymhost.environments._agentenv._forking import BundleLauncher
    from gymhost.environments._errors import EnvUnavailableError
    from gymhost.environments._settings import PoolSettings

    async def answered(client: Any) -> None:
        while True:
            try:
                await client.describe()
                return
            except EnvUnavailableError:
                await asyncio.sleep(0.05)

    async def run() -> dict[str, Any]:
        me = os.getpid()
        settings = PoolSettings.model_validate({})
        launchers, firsts, templates = {}, {}, {}
        for name, way in ways.items():
            known = set(tree(me))
            launchers[name] = BundleLauncher(
                folder / "bundle",
                construct_once=way.get("construct_once", True),
                confinement=confinement(way.get("sandbox", "auto")),  # type: ignore[arg-type]
            )
            firsts[name] = await launchers[name].launch(0, settings)  # the template started and warm
            await answered(firsts[name].client)
            templates[name] = [pid for pid in tree(me) if pid not in known]  # its template, and its first instance
        await asyncio.sleep(1.0)  # idle, as a pool's template is between batches: it settles (``_rehearsal``)
        before = {pid: cpu_seconds_precise(pid) for pid in tree(me)}
        each: dict[str, list[float]] = {name: [] for name in ways}
        own: dict[str, float] = dict.fromkeys(ways, 0.0)
        started: dict[str, list[Any]] = {name: [] for name in ways}
        theirs: dict[str, list[int]] = {name: [] for name in ways}
        for index in range(1, count + 1):
            for name, _ in in_turn(ways, index):
                known = set(tree(me))
                mine = cpu_seconds_precise(me)
                one = time.perf_counter()
                instance = await launchers[name].launch(index, settings)
                await answered(instance.client)
                each[name].append(time.perf_counter() - one)
                own[name] += cpu_seconds_precise(me) - mine
                started[name].append(instance)
                theirs[name] += [pid for pid in tree(me) if pid not in known]
        after = {pid: cpu_seconds_precise(pid) for pid in tree(me)}
        out: dict[str, Any] = {}
        for name in ways:
            last = started[name][-1].process.pid
            pss = 0.0
            for pid in [last, *tree(last)]:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) / 1024
            template = sum(after[pid] - before[pid] for pid in templates[name] if pid in after and pid in before)
            instances = sum(after.get(pid, 0.0) for pid in theirs[name])
            times = sorted(each[name])
            out[name] = {"starts": count, "wall_ms": round(sum(times) * 1000 / count, 1),
                         "wall_p50_ms": round(times[len(times) // 2] * 1000, 1),
                         "wall_p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 1),
                         "server_cpu_ms": round(own[name] * 1000 / count, 2),
                         "template_cpu_ms": round(template * 1000 / count, 2),
                         "instance_cpu_ms": round(instances * 1000 / count, 2),
                         "idle_instance_pss_mb": round(pss, 1)}  # fmt: skip
        for name, launcher in launchers.items():
            for instance in [firsts[name], *started[name]]:
                await launcher.stop(instance)
            await launcher.close()
        return out

    return asyncio.run(run())


def scale(root: Path, quick: bool) -> dict[str, Any]:
    """The pool under a training run's load, on folders written with default options."""
    episodes, burst = (64, 50) if quick else (256, 200)
    out: dict[str, Any] = {}
    folder = write_gridsim(root / "default", instances=None, mode="process")
    rows = str(folder / "data" / "eval.jsonl")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server(gymhost_serve(folder, port), url) as process:
        idle_pool(url)
        out["think_time"] = loadgen("think", url, rows, "--pid", str(process.pid), "--episodes", str(episodes),
                                    "--think", "0.5", "--calls", "4")  # fmt: skip
        think = out["think_time"]
        print(f"  think time, {episodes} episodes: {think['errors']} errors, peak {think['peak_instances']} instances,"
              f" seed p50/p99 {think['seed'].get('p50_ms')}/{think['seed'].get('p99_ms')} ms,"
              f" {think['peak_rss_mb']} MB")  # fmt: skip
        out["process_mode_64"] = sixty_four(url, rows, process.pid, quick)
    # The same load in-process, for the ratio in one run: what a process per episode costs over none.
    folder = write_gridsim(root / "default-in-process", instances=None, mode="in-process")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server(gymhost_serve(folder, port), url) as process:
        out["in_process_mode_64"] = sixty_four(url, str(folder / "data" / "eval.jsonl"), process.pid, quick)
    for mode in ("process_mode_64", "in_process_mode_64"):
        played = out[mode]
        print(
            f"  {mode}: {played['calls_per_s']} calls/s, tool call p50 {played['look'].get('p50_ms')} ms,"
            f" gymhost CPU {played['gymhost_cpu_ms_per_request']} ms/request"
            f" ({played['instances_cpu_ms_per_request']} ms in the rest of the machine, its instances included)"
        )
    out["instance_starts"] = starts = instance_starts(write_gridsim(root / "starts", None, "process"), 40)
    print(f"  an instance start: {starts['wall_ms']} ms, CPU {starts['instance_cpu_ms']} ms in the instance,"
          f" {starts['template_cpu_ms']} ms in the template, {starts['server_cpu_ms']} ms here;"
          f" {starts['idle_instance_pss_mb']} MB PSS idle")  # fmt: skip
    for mode in ("process", "in-process"):
        folder = write_gridsim(root / f"burst-{mode}", instances=None, mode=mode)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with server(gymhost_serve(folder, port), url):
            idle_pool(url)
            result = loadgen("burst", url, str(folder / "data" / "eval.jsonl"), "--seeds", str(burst))
        out[f"cold_burst_{mode.replace('-', '_')}"] = result
        print(f"  cold burst, {mode}: {result['seeded']}/{burst} seeded, last after {result['last_seed_s']} s")
    return out


def cold_start(root: Path, quick: bool, baseline: str | None = None) -> dict[str, Any]:
    """A cold training batch on an idle default pool (process mode, 4 instances up: ``idle_pool``), with instances
    forked from one environment the template constructed (``source.construct_once``, the default) against each
    instance constructing its own (``false``, as before), and, given a ``baseline`` revision, against that revision's
    default: 256 think-time episodes at once, in interleaved rounds on fresh servers, the round with the median seed
    p99 of each; and 40 starts one after another by this checkout's launcher, with the CPU of each process a start."""
    episodes, rounds = (64, 1) if quick else (256, 3)
    folder = write_gridsim(root / "cold", instances=None, mode="process")
    rows = str(folder / "data" / "eval.jsonl")
    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        "construct_each": (["source.construct_once=false"], {}),
        "construct_once": ([], {}),
    }
    if baseline is not None:
        from request_path import baseline_environment

        variants["baseline"] = ([], baseline_environment(baseline))
    played: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for number in range(rounds):
        for name, (settings, environment) in in_turn(variants, number):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with server(gymhost_serve(folder, port, *settings), url, env=environment) as process:
                idle_pool(url)
                before, machine = _cpu_and_faults(process.pid), machine_cpu_s()
                think = loadgen("think", url, rows, "--pid", str(process.pid), "--episodes", str(episodes),
                                "--think", "0.5", "--calls", "4")  # fmt: skip
                think["cpu_ms_an_episode"] = _cpu_split(process.pid, before, episodes)
                # What the batch cost the whole machine, from the seeds to the last verdict: the instances (which come
                # and go; the exits of the last ones may end after it) and the load generator too.
                think["cpu_ms_an_episode"]["machine"] = round((machine_cpu_s() - machine) / episodes * 1000, 2)
            played[name].append(think)
            print(f"  {name}: seed p50/p99 {think['seed'].get('p50_ms')}/{think['seed'].get('p99_ms')} ms,"
                  f" {think['errors']} errors, peak {think['peak_instances']} instances,"
                  f" CPU an episode {think['cpu_ms_an_episode']}")  # fmt: skip
    out: dict[str, Any] = {"episodes": episodes, "rounds": rounds}
    for name in variants:
        by_p99 = sorted(played[name], key=lambda think: think["seed"].get("p99_ms") or 0.0)
        out[name] = {"think_time": by_p99[len(by_p99) // 2], "seed_p99_ms_of_each_round": [
            think["seed"].get("p99_ms") for think in played[name]], "cpu_ms_an_episode_of_each_round": [
            think["cpu_ms_an_episode"] for think in played[name]]}  # fmt: skip
        if name != "baseline":  # measured with this checkout's launcher, in this process
            out[name]["starts"] = instance_starts(folder, 40, construct_once=name == "construct_once")
    once, each = (out[name]["think_time"]["seed"].get("p99_ms") for name in ("construct_once", "construct_each"))
    out["p99_once_vs_each"] = round(once / each, 2) if once and each else None
    if baseline is not None:
        out["baseline"]["revision"] = baseline
        before = out["baseline"]["think_time"]["seed"].get("p99_ms")
        out["p99_vs_baseline"] = round(once / before, 2) if once and before else None
    return out


def machine_cpu_s() -> float:
    """The CPU seconds every core of the machine has run (``/proc/stat``: user, nice, system, irq and softirq; not
    the time a hypervisor stole, nor guest time, which user time already counts), processes that come and go and the
    kernel's own threads included."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = (int(value) for value in stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / _TICK


def _cpu_and_faults(pid: int) -> dict[int, tuple[float, float, int]]:
    """User and system CPU seconds and minor page faults of a server and of each process under it, as they are now."""
    found = {}
    for process in (pid, *tree(pid)):
        with contextlib.suppress(OSError):  # one that ended meanwhile
            found[process] = process_times(process)
    return found


def _cpu_split(pid: int, before: dict[int, tuple[float, float, int]], episodes: int) -> dict[str, float]:
    """A cold batch's CPU an episode in the server's own process and in the processes under it that lived through
    the batch (the instance template, and bubblewrap's around it: not the instances, which come and go), the
    template's system share and minor faults apart: what each spawn costs the process that forks it."""
    after = _cpu_and_faults(pid)
    server = sum(after[pid][:2]) - sum(before[pid][:2])
    lasting = [process for process in before if process != pid and process in after]
    user = sum(after[process][0] - before[process][0] for process in lasting)
    system = sum(after[process][1] - before[process][1] for process in lasting)
    faults = sum(after[process][2] - before[process][2] for process in lasting)
    return {
        "server": round(server / episodes * 1000, 2),
        "template_user": round(user / episodes * 1000, 2),
        "template_system": round(system / episodes * 1000, 2),
        "template_faults": round(faults / episodes),
    }


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def route_mean_ms(samples: dict[Any, float], route: str) -> float | None:
    def total(name: str) -> float:
        return sum(v for (n, labels), v in samples.items() if n == name and dict(labels).get("http_route") == route)

    count = total("http_server_request_duration_seconds_count")
    return round(total("http_server_request_duration_seconds_sum") / count * 1000, 3) if count else None


HAPROXY_RECIPE = REPO / "deploy" / "haproxy" / "haproxy.cfg"
WORKER_VARIANTS = {  # label -> gymhost serve options
    "1": ["--workers", "1"],
    "2": ["--workers", "2"],  # a misdirected connection handed to its owner (the default)
    "2 forward": ["--workers", "2", "--no-hand-off"],  # its requests forwarded through the accepting worker
}


def workers(root: Path, quick: bool) -> dict[str, Any]:
    """--workers 2 against --workers 1 as verifiers loads a server: 64 concurrent gridsim episodes of 20 tool calls
    (in-process instances), every request on a connection of its own, so about half reach the worker that does not
    hold their episode. CPU of the server's whole process tree from /proc, per request; the variants interleaved
    round by round, so a drift of the shared machine reaches each alike; medians of the rounds."""
    folder = write_gridsim(root / "workers", instances="64:300")
    rows = str(folder / "data" / "eval.jsonl")
    episodes, rounds = (64, 1) if quick else (256, 3)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in WORKER_VARIANTS}
    play = ["episodes", "--concurrency", "64", "--looks", "20", "--moves", "0", "--new-connections"]
    with contextlib.ExitStack() as stack:
        servers = {}
        for label, options in WORKER_VARIANTS.items():
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            servers[label] = (url, stack.enter_context(server([*gymhost_serve(folder, port), *options], url)))
            loadgen(play[0], url, rows, *play[1:], "--episodes", "64")  # the pool grown to 64, connections warm
        for number in range(rounds):
            for label, (url, process) in in_turn(servers, number):
                before, cpu = scrape(url), _tree_cpu(process.pid)
                played = loadgen(play[0], url, rows, *play[1:], "--episodes", str(episodes))
                used = _tree_cpu(process.pid) - cpu
                during = {key: value - before.get(key, 0.0) for key, value in scrape(url).items()}
                requests = played["look"]["count"] + 2 * played["episodes"]
                handed = sum(v for (name, labels), v in during.items()
                             if name == "gymhost_handoffs_total" and dict(labels).get("outcome") == "sent")  # fmt: skip
                forwarded = sum(v for (name, labels), v in during.items()
                                if name == "http_server_request_duration_seconds_count"
                                and dict(labels).get("http_route") == "(forwarded)")  # fmt: skip
                runs[label].append({
                    "requests": requests,
                    "errors": played["errors"],
                    "requests_per_s": round(requests * played["episodes_per_s"] / max(1, played["episodes"]), 1),
                    "cpu_ms_per_request": round(used * 1000 / max(1, requests), 4),
                    "handed_off": handed,
                    "forwarded": forwarded,
                    "look_p50_ms": played["look"].get("p50_ms"),
                    "look_p99_ms": played["look"].get("p99_ms"),
                })  # fmt: skip
    out: dict[str, Any] = {"episodes": episodes, "rounds": rounds, "calls_per_episode": 20, "variants": {}}
    for label, measured in runs.items():
        middle = sorted(measured, key=lambda run: run["cpu_ms_per_request"])[len(measured) // 2]
        out["variants"][label] = {**middle, "rounds_cpu_ms_per_request": [r["cpu_ms_per_request"] for r in measured],
                                  "rounds_requests_per_s": [r["requests_per_s"] for r in measured],
                                  "errors": sum(r["errors"] for r in measured)}  # fmt: skip
    one, two, forward = (out["variants"][label] for label in WORKER_VARIANTS)
    # What one misdirected request costs the tree beyond a request served where it landed: --workers 2's extra CPU
    # a request over --workers 1, divided by the share of requests misdirected (an upper bound: it also holds what a
    # second process costs, the metrics shared through files among them).
    for variant, moved in ((two, "handed_off"), (forward, "forwarded")):
        share = variant[moved] / max(1, variant["requests"])
        extra = variant["cpu_ms_per_request"] - one["cpu_ms_per_request"]
        variant["misdirected_share"] = round(share, 3)
        variant["extra_us_per_misdirected"] = round(extra * 1000 / share, 1) if share else None
        variant["cpu_vs_one_worker"] = round(variant["cpu_ms_per_request"] / one["cpu_ms_per_request"], 3)
        variant["rps_vs_one_worker"] = round(variant["requests_per_s"] / one["requests_per_s"], 3)
    out["one_hand_off"] = one_hand_off_us(1024 if quick else 8192)
    print(f"  one hand-off alone: {out['one_hand_off']['one_hand_off_us']} us of CPU")
    for label, variant in out["variants"].items():
        print(f"  --workers {label}: {variant['requests_per_s']} requests/s, {variant['cpu_ms_per_request']} ms CPU a"
              f" request, {variant['handed_off']:.0f} handed off, {variant['forwarded']:.0f} forwarded,"
              f" {variant['errors']} errors")  # fmt: skip
    return out


def one_hand_off_us(connections: int) -> dict[str, float]:
    """The CPU of one hand-off alone, in this one process (so CPU time is the whole of it): a worker's acceptor
    takes ``connections`` connections whose head names its sibling, once serving each itself and once handing each
    to the sibling's receiver (the real classes, real sockets); the difference a connection is the hand-off: the
    peek, the head read, the ``sendmsg`` and the sibling's ``recvmsg``. Clients and the answering protocol are the
    same both times."""
    import asyncio
    import base64

    import itsdangerous

    from gymhost._serving._accepting import Acceptor
    from gymhost._serving._handoff import HandOffReceiver
    from gymhost._sessions._identity import process_state
    from gymhost._sessions._owner import OWNER_KEY

    folder = Path(tempfile.mkdtemp(prefix="gymhost-handoff-"))
    process_state.become_worker(0, str(folder))
    sibling = {"replica": process_state.replica, "worker": 1, "start": "s"}
    payload = base64.b64encode(json.dumps({"session_id": "x", OWNER_KEY: sibling}).encode())
    cookie = itsdangerous.TimestampSigner("secret", salt="gymhost.session:").sign(payload).decode()
    head = f"POST /gridsim_look HTTP/1.1\r\nhost: gymhost\r\ncookie: GridSim___gridsim={cookie}\r\n\r\n".encode()

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            self.transport.close()

    async def run(hand_off: bool) -> float:
        loop = asyncio.get_running_loop()
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(1024)
        listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
        zero = Acceptor(loop, listening, Answer, hand_off=hand_off)
        path = folder / "worker-1.handoff"
        path.unlink(missing_ok=True)
        receiving = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        receiving.bind(str(path))
        receiving.listen(4)
        one = Acceptor(loop, socket.socket(), Answer)
        receiver = HandOffReceiver(loop, receiving, one.serve)
        zero.start()
        receiver.start()
        port = listening.getsockname()[1]

        async def client() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            await reader.read()
            writer.close()

        await asyncio.gather(*(client() for _ in range(64)))  # warm
        began = time.process_time()
        for _ in range(connections // 64):
            await asyncio.gather(*(client() for _ in range(64)))
        used = time.process_time() - began
        zero.close()
        receiver.close()
        listening.close()
        return used * 1e6 / (connections // 64 * 64)

    try:
        served, handed = [], []
        for _ in range(3):  # interleaved; the medians
            served.append(asyncio.run(run(False)))
            handed.append(asyncio.run(run(True)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    served_us, handed_us = sorted(served)[1], sorted(handed)[1]
    return {"served_here_us": round(served_us, 1), "handed_off_us": round(handed_us, 1),
            "one_hand_off_us": round(handed_us - served_us, 1)}  # fmt: skip


def _tree_cpu(pid: int) -> float:
    """CPU time of a process and every process under it (a server's workers, its instances)."""
    return cpu_seconds(pid) + _descendants_cpu(pid)


def scale_out(root: Path, quick: bool) -> dict[str, Any]:
    """Workers on one host, the cost of a forwarded request, and replicas behind HAProxy (the deploy/ recipe)."""
    seconds = 2 if quick else 4
    folder = gym_root() / EXAMPLE
    row = json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
    gridsim = write_gridsim(root / "scale-out", instances=300)
    rows = str(gridsim / "data" / "eval.jsonl")
    count = 64 if quick else 640
    out: dict[str, Any] = {"tool_calls": {}, "episodes": {}}
    for workers in (1, 2):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with server([*gymhost_serve(folder, port), "--workers", str(workers)], url):
            cookie = seed_cookie(url, row)
            wrk(f"{url}/get_weather", 16, 1, cookie)
            before = scrape(url)
            calls = [wrk(f"{url}/get_weather", 1, seconds, cookie)]
            if workers == 2:  # one connection, no queueing: the seeded session lives on one worker; if the other
                # accepted the connection, it handed it over (or forwarded); the servers' own metrics time both
                during = {key: value - before.get(key, 0.0) for key, value in scrape(url).items()}
                out["forwarded_mean_ms"] = route_mean_ms(during, "(forwarded)")
                out["owner_mean_ms"] = route_mean_ms(during, "/get_weather")
            calls.append(wrk(f"{url}/get_weather", 64, seconds, cookie))
            out["tool_calls"][str(workers)] = calls
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with server([*gymhost_serve(gridsim, port), "--workers", str(workers)], url):
            out["episodes"][str(workers)] = loadgen("episodes", url, rows, "--concurrency", "64", "--episodes",
                                                    str(count), "--looks", "4", "--moves", "0")  # fmt: skip
    for workers in ("1", "2"):
        calls, played = out["tool_calls"][workers], out["episodes"][workers]
        print(f"  --workers {workers}: tool calls {calls[0]['rps']:.0f}/s c=1, {calls[1]['rps']:.0f}/s c=64; "
              f"{played['episodes_per_s']} episodes/s at 64")  # fmt: skip
    print(f"  a forwarded request {out['forwarded_mean_ms']} ms mean, answered by its owner in {out['owner_mean_ms']}")
    # Three replicas on this host behind HAProxy, against one replica alone, the same episodes.
    with contextlib.ExitStack() as stack:
        ports = [free_port() for _ in range(3)]
        for n, port in enumerate(ports, 1):
            stack.enter_context(server([*gymhost_serve(gridsim, port), "--replica-id", f"r{n}"],
                                       f"http://127.0.0.1:{port}", ready="/readyz"))  # fmt: skip
        front = free_port()
        recipe = HAPROXY_RECIPE.read_text()
        config = (
            re.sub(r"(?m)^    server r\d .*\n?", "", recipe).rstrip()
            + "\n"
            + "".join(f"    server r{n} 127.0.0.1:{port} check cookie r{n}\n" for n, port in enumerate(ports, 1))
        )
        path = root / "haproxy.cfg"
        path.write_text(config.replace("    bind :8080", f"    bind 127.0.0.1:{front}"))
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(path)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            time.sleep(3)  # health checks: rise 2 at 1 s
            url = f"http://127.0.0.1:{front}"
            out["haproxy_3_replicas"] = loadgen("episodes", url, rows, "--concurrency", "64", "--episodes",
                                                str(count), "--looks", "4", "--moves", "0")  # fmt: skip
            one = f"http://127.0.0.1:{ports[0]}"
            out["one_replica_direct"] = loadgen("episodes", one, rows, "--concurrency", "64", "--episodes",
                                                str(count), "--looks", "4", "--moves", "0")  # fmt: skip
        finally:
            haproxy.terminate()
            haproxy.wait(10)
    print(f"  3 replicas behind HAProxy: {out['haproxy_3_replicas']['episodes_per_s']} episodes/s; one replica "
          f"direct: {out['one_replica_direct']['episodes_per_s']}")  # fmt: skip
    return out


class Sampler:
    """Peak resident memory and open descriptors of a server's process tree (its workers included), sampled every
    0.2 s while a burst runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_mb = self.peak_fds = 0.0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()

    def _run(self) -> None:
        while not self._stop:
            pids = [self.pid, *tree(self.pid)]
            rss = fds = 0.0
            for pid in pids:
                with contextlib.suppress(OSError, StopIteration, ValueError):
                    rss += resident_mb(pid)
                    fds += len(os.listdir(f"/proc/{pid}/fd"))
            self.peak_rss_mb, self.peak_fds = max(self.peak_rss_mb, rss), max(self.peak_fds, fds)
            time.sleep(0.2)


def tree(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir() if Path(f"/proc/{pid}/task").is_dir() else []:
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += [int(child), *tree(int(child))]
    return found


HARD_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # the most descriptors one process here may have
# A burst.py process holds one descriptor per open connection: a burst beyond one process's limit is split.
_CLIENT_CONNECTIONS = HARD_NOFILE - 1024


def burst(url: str, pid: int, requests: int, *args: str, keep_alive: int = 0) -> dict[str, Any]:
    """``requests`` connections at once from as many burst.py processes as the descriptor limit needs, started at
    the same instant; their outcomes and latencies added up, with the server tree's peak memory and descriptors."""
    idle_rss = sum(resident_mb(p) for p in [pid, *tree(pid)])
    idle_fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in [pid, *tree(pid)])
    clients = -(-requests // _CLIENT_CONNECTIONS)
    shares = [requests // clients + (index < requests % clients) for index in range(clients)]
    start_at = time.time() + 2.0 + 0.5 * clients  # every client connected up and waiting
    extra = [*args, *(["--keep-alive", str(keep_alive)] if keep_alive else [])]
    with Sampler(pid) as sampled:
        commands = [
            [
                PYTHON,
                str(HERE / "burst.py"),
                url,
                "--requests",
                str(share),
                "--first",
                str(sum(shares[:index])),
                "--start-at",
                str(start_at),
                *extra,
            ]
            for index, share in enumerate(shares)
        ]
        running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
        finished = [process.communicate(timeout=1800) for process in running]
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    walls = []
    for process, (out, err) in zip(running, finished, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"burst.py failed: {err[-2000:]}")
        one = json.loads(out)
        outcomes.update(one["outcomes"])
        latencies += one["latencies_ms"]
        walls.append(one["wall_s"])
    latencies.sort()

    def at(share: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(share * len(latencies)))] if latencies else None

    return {
        "requests": sum(outcomes.values()),
        "answered": sum(count for outcome, count in outcomes.items() if outcome.isdigit()),
        "ok": outcomes.get("200", 0),
        "outcomes": dict(outcomes),
        "wall_s": max(walls),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "client_processes": clients,
        "idle_rss_mb": round(idle_rss, 1),
        "peak_rss_mb": round(sampled.peak_rss_mb, 1),
        "idle_fds": idle_fds,
        "peak_fds": int(sampled.peak_fds),
    }


Launch = tuple[list[str], dict[str, str], Path | None, str]  # command, environment, working directory, URL


def load(root: Path, quick: bool) -> dict[str, Any]:
    """Gym's stated load: bursts of concurrent requests, each on a connection of its own (verifiers opens one per
    call), and keep-alive connections at the same concurrency; every server started at the usual soft limit of
    open files (1024, the hard limit high, as containerd gives containers), which each raises itself; then a hard
    limit of 1024, which no server can raise; and whole episodes of the written gridsim server."""
    sizes = (1024, 4096) if quick else (4096, 16384, 65536)
    keep_alive = sizes[-2]
    # The usual soft limit, and the highest hard one this machine gives (a container without CAP_SYS_RESOURCE
    # cannot raise its hard limit).
    usual = ["prlimit", f"--nofile=1024:{HARD_NOFILE}", "--"]
    low = ["prlimit", "--nofile=1024:1024", "--"]
    results: dict[str, Any] = {"sizes": list(sizes), "keep_alive_connections": keep_alive, "runs": [],
                               "hard_limit": HARD_NOFILE}  # fmt: skip

    def run(label: str, launch: Launch, plan: list[tuple[str, int, list[str]]]) -> None:
        command, env, cwd, url = launch
        began = time.monotonic()
        with server(command, url, cwd=cwd, env=env, startup_s=900) as process:  # a pool of 16,384 takes a while
            startup_s = round(time.monotonic() - began, 1)
            for mode, size, extra in plan:
                before = refusals(url, label.startswith("gymhost"))
                measured = burst(url, process.pid, size, *extra, keep_alive=4 if mode == "keep-alive" else 0)
                after = refusals(url, label.startswith("gymhost"))
                measured["counted_by_the_server"] = (
                    {name: after[name] - before.get(name, 0) for name in after}
                    if after is not None and before is not None
                    else None
                )
                measured.update(server=label, mode=mode, size=size, startup_s=startup_s)
                results["runs"].append(measured)
                print(
                    f"  {label}, {mode}, {size}: {measured['ok']}/{measured['requests']} answered 200 in "
                    f"{measured['wall_s']} s (p50 {measured['p50_ms']} ms, p99 {measured['p99_ms']} ms), peak "
                    f"{measured['peak_rss_mb']} MB and {measured['peak_fds']} descriptors; {measured['outcomes']}"
                )

    for limit, plan in (
        (
            usual,
            [("a connection each", size, []) for size in sizes] + [("keep-alive", keep_alive, [])],
        ),
        (low, [("a connection each, hard limit 1024", sizes[0], [])]),
    ):
        for label, launch in tool_call_servers(limit).items():
            if limit is low and label.endswith("--workers 2"):
                continue
            run(label, launch, plan)
    for size in sizes[:2]:
        # A pool as large as the load (the cold start of a pool is the scale section's): what is measured is serving.
        folder = write_gridsim(root / f"load-{size}", instances=size)
        rows = ["--episodes", str(folder / "data" / "eval.jsonl")]
        for label, extra in (("gymhost", []), ("gymhost --workers 2", ["--workers", "2"])):
            port = free_port()
            launch = ([*usual, *gymhost_serve(folder, port), *extra], {"GYMHOST_SECRET": "bench"}, None, url_at(port))
            run(f"{label}, gridsim episodes", launch, [("episodes, a connection each request", size, rows)])
    return results


_REFUSALS = ("gymhost_accept_errors_total", "gymhost_listen_overflows_total", "gymhost_forward_failures_total")


def refusals(url: str, ours: bool) -> dict[str, float] | None:
    """What a gymhost server (``ours``) counted of the connections it could not take (accept errors, kernel
    listen-queue overflows) from its /metrics; None for a server without them (Gym's launcher). A counter that never
    counted is 0 (under --workers, prometheus_client's multiprocess mode does not export it at all)."""
    if not ours:
        return None
    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    found = dict.fromkeys(_REFUSALS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found and not line.startswith("#"):
            found[name] += float(line.rsplit(" ", 1)[1])
    return found


def tool_call_servers(limit: list[str]) -> dict[str, Launch]:
    """example_single_tool_call under gymhost, gymhost with two workers, and Gym's own launcher."""
    folder = gym_root() / EXAMPLE
    ports = [free_port() for _ in range(3)]
    return {
        "gymhost": ([*limit, *gymhost_serve(folder, ports[0])], {}, None, url_at(ports[0])),
        "gymhost --workers 2": (
            [*limit, *gymhost_serve(folder, ports[1]), "--workers", "2"],
            {"GYMHOST_SECRET": "bench"},
            None,
            url_at(ports[1]),
        ),
        "Gym's launcher": ([*limit, PYTHON, "app.py"], gym_launcher_env(folder, ports[2]), folder, url_at(ports[2])),
    }


def url_at(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    wrk = shutil.which("wrk")  # the load section alone does not need it
    wrk_version = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.split("\n")[0] if wrk else None
    return {"cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "os": platform.platform(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "packages": versions, "wrk": wrk_version}  # fmt: skip


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    calls = results["tool_calls"]
    by = {name: {r["concurrency"]: r for r in rows} for name, rows in calls.items()}
    out: dict[str, Any] = {"tool_call_throughput": {}, "bridge_latency": {}}
    for c in CONCURRENCY:
        gh = by["gymhost_uvicorn"][c]["rps"]
        out["tool_call_throughput"][str(c)] = {
            "gymhost_vs_gym_launcher": round(gh / by["gym_launcher"][c]["rps"], 2),
            "gymhost_vs_bare": round(gh / by["bare_starlette"][c]["rps"], 2),
            "gymhost_vs_plain_fastapi": round(gh / by["plain_fastapi"][c]["rps"], 2),
            "plain_fastapi_vs_bare": round(by["plain_fastapi"][c]["rps"] / by["bare_starlette"][c]["rps"], 2),
            "hypercorn_vs_gym_launcher": round(by["gymhost_hypercorn"][c]["rps"] / by["gym_launcher"][c]["rps"], 2),
            "with_vs_without_http_metrics": round(gh / by["gymhost_no_http_metrics"][c]["rps"], 3),
        }
    episodes = results["episodes"]
    for through, direct in zip(episodes["tool_calls_through_gymhost"], episodes["direct_mcp"], strict=True):
        out["bridge_latency"][str(through["concurrency"])] = {
            "p50": round(through["look"]["p50_ms"] / direct["look"]["p50_ms"], 2),
            "mean": round(through["look"]["mean_ms"] / direct["look"]["mean_ms"], 2),
        }
    if "openenv" in results:
        bridged = results["openenv"]
        out["openenv_bridge_latency"] = {
            str(through["concurrency"]): {
                "p50": round(through["look"]["p50_ms"] / direct["look"]["p50_ms"], 2),
                "mean": round(through["look"]["mean_ms"] / direct["look"]["mean_ms"], 2),
            }
            for through, direct in zip(bridged["through_gymhost"], bridged["direct_ws"], strict=True)
        }
    levels = results["concurrency"]["levels"]
    clean = [level for level in levels if not level["seed_errors"] and not level["call_errors"]]
    if clean:
        top = clean[-1]
        out["max_open_episodes_without_errors"] = top["open_episodes"]
        held = results["concurrency"]
        per = (top["rss_mb"] - held["baseline_rss_mb"]) / max(1, top["open_episodes"])
        out["rss_kb_per_open_episode_with_its_instance"] = round(per * 1024, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="short measurements, for checking the harness")
    parser.add_argument("--only", choices=["load", "scale", "workers", "cold_start"],
                        help="one section alone: results/<date>-<section>.json")  # fmt: skip
    parser.add_argument("--baseline", help="with --only cold_start: a git revision's default pool beside this one's")
    args = parser.parse_args()
    if args.baseline and args.only != "cold_start":
        parser.error("--baseline goes with --only cold_start")
    if os.geteuid() != 0:  # the servers are not dumpable: their memory maps and descriptors are root's to read
        parser.error("run the benchmarks as root: they read the servers' /proc files (smaps_rollup, fd)")
    if args.only:
        alone: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                                 "machine": machine(), "quick": args.quick}  # fmt: skip
        section = {"load": load, "scale": scale, "workers": workers, "cold_start": cold_start}[args.only]
        with tempfile.TemporaryDirectory(prefix="gymhost-bench-") as scratch:
            print(f"{args.only}:")
            baseline = {"baseline": args.baseline} if args.baseline else {}  # cold_start's alone takes one
            alone[args.only] = section(Path(scratch), args.quick, **baseline)
        write_results(alone, alone["date"][:10] + f"-{args.only}" + ("-quick" if args.quick else ""))
        return
    import hypercorn_loops
    import layers
    import process_mode
    import request_profile
    import written_calls

    if shutil.which("wrk") is None:
        raise SystemExit("bench: wrk is not installed (Debian: apt-get install wrk); `make bench` installs it")
    request_profile.check_py_spy()
    seconds, rounds, scale_by, levels = (
        (1, 1, 0.25, "50,100") if args.quick else (4, 3, 1.0, "100,1000,2500,5000,7500,10000")
    )
    results: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                               "machine": machine(), "quick": args.quick}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gymhost-bench-") as scratch:
        print("tool calls (wrk):")
        results["tool_calls"] = tool_calls(seconds, rounds)
        print("episodes:")
        results["episodes"] = episodes(Path(scratch), scale_by)
        print("open episodes:")
        results["concurrency"] = concurrency(Path(scratch), levels)
        print("scale:")
        results["scale"] = scale(Path(scratch), args.quick)
        print("cold start (instances constructed once, or each):")
        results["cold_start"] = cold_start(Path(scratch), args.quick)
        print("scale-out:")
        results["scale_out"] = scale_out(Path(scratch), args.quick)
        print("workers (verifiers-style, a connection per request):")
        results["workers"] = workers(Path(scratch), args.quick)
        print("openenv:")
        results["openenv"] = openenv_bridge(Path(scratch), scale_by)
        print("load (Gym's stated concurrency):")
        results["load"] = load(Path(scratch), args.quick)
    print("hypercorn's loops:")
    results["hypercorn"] = hypercorn_loops.measure(*((2, 1) if args.quick else (20, 3)))
    print("a written server's tool call:")
    results["written"] = written_calls.measure(*((1, 1) if args.quick else (4, 3)))
    print("a Gym server's tool call, layer by layer (in-process):")
    results["layers"] = layers.measure(*((200, 2) if args.quick else (2000, 9)))
    print("the request path under load, by piece (py-spy):")
    results["request_profile"] = request_profile.measure(*((1, 2, 100) if args.quick else (3, 10, 250)))
    print("process mode beside in-process mode:")
    results["process_mode"] = process_mode.measure(1 if args.quick else 5)
    results["ratios"] = ratios(results)
    write_results(results, results["date"][:10] + ("-quick" if args.quick else ""))
    print(json.dumps(results["ratios"], indent=2))


def write_section(section: str, measure: Callable[[], dict[str, Any]]) -> None:
    """One section run alone (``python layers.py`` and the like): dated as it starts, with the machine, into
    ``results/<date>-<section, dashed>.json`` and its README block."""
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine()}
    record[section] = measure()
    stamp = f"{record['date'][:10]}-{section.replace('_', '-')}"
    path = write_results(record, stamp)
    print(f"(raw: results/{path.name})", file=sys.stderr)


def write_results(results: dict[str, Any], stamp: str) -> Path:
    """The run's results file (``results_path``; a quick run replaces the last quick one), and the README's tables
    (and a full run's plot) rendered from it."""
    from report import update_readme, write_plot

    path = results_path(stamp, replace=stamp.endswith("-quick"))
    path.write_text(json.dumps(results, indent=2) + "\n")
    if "concurrency" in results:
        write_plot(results, HERE / "concurrency.svg")
    if "tool_calls" in results and not results.get("quick"):  # a full run's figures replace the last one's (plots/)
        from plots import draw

        for figure in draw(results):
            print(f"  drew {figure.relative_to(HERE)}")
    update_readme(results, HERE / "README.md", f"results/{path.name}")
    return path


def results_path(stamp: str, *, replace: bool = False) -> Path:
    """``results/<stamp>.json``, or, when a run of the day is there already (which the README may cite), the first
    free ``<stamp>-2.json``, ``-3``...; ``replace``: the stamp's own file, whatever it holds."""
    (HERE / "results").mkdir(exist_ok=True)
    path, number = HERE / "results" / f"{stamp}.json", 2
    while path.exists() and not replace:
        path, number = HERE / "results" / f"{stamp}-{number}.json", number + 1
    return path


if __name__ == "__main__":
    main()
