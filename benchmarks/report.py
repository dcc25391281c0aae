"""Turn a run's results into the tables of benchmarks/README.md and the memory plot (benchmarks/concurrency.svg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

START, END = "<!-- results:start -->", "<!-- results:end -->"
# The load section has a block of its own: `run.py --only load` reruns it alone (a full run writes it too).
LOAD_START, LOAD_END = "<!-- load:start -->", "<!-- load:end -->"
WORKERS_START, WORKERS_END = "<!-- workers:start -->", "<!-- workers:end -->"  # and `run.py --only workers`
HYPERCORN_START, HYPERCORN_END = "<!-- hypercorn:start -->", "<!-- hypercorn:end -->"  # and hypercorn_loops.py
COLD_START, COLD_END = "<!-- cold-start:start -->", "<!-- cold-start:end -->"
WRITTEN_START, WRITTEN_END = "<!-- written:start -->", "<!-- written:end -->"  # and written_calls.py
LAYERS_START, LAYERS_END = "<!-- layers:start -->", "<!-- layers:end -->"  # and layers.py
PROCESS_START, PROCESS_END = "<!-- process-mode:start -->", "<!-- process-mode:end -->"  # and process_mode.py
PROFILE_START, PROFILE_END = "<!-- request-profile:start -->", "<!-- request-profile:end -->"  # request_profile.py
CONFINEMENT_START, CONFINEMENT_END = "<!-- confinement:start -->", "<!-- confinement:end -->"  # and confinement.py
CONFINED_SERVER_START, CONFINED_SERVER_END = "<!-- confined-server:start -->", "<!-- confined-server:end -->"
HYPERCORN_NAMES = {
    "gymhost_hypercorn": "`gymhost serve --server hypercorn` (asyncio's loop)",
    "hypercorn_asyncio": "`hypercorn gymhost.asgi:app -k asyncio`",
    "hypercorn_uvloop": "`hypercorn gymhost.asgi:app -k uvloop`",
}
NAMES = {
    "bare_starlette": "(a) bare Starlette endpoint (limit)",
    "plain_fastapi": "plain FastAPI route, same models, no middleware (FastAPI's floor)",
    "gym_launcher": "(b) Gym's own launcher (`python app.py`)",
    "gymhost_uvicorn": "(c) `gymhost serve` (uvicorn)",
    "gymhost_hypercorn": "(d) `gymhost serve --server hypercorn`",
    "gymhost_no_http_metrics": "(c') `gymhost serve --no-http-metrics`",
}


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with the measured value and whether it was met."""
    ratios = results["ratios"]
    calls = ratios["tool_call_throughput"]
    levels = ("1", "64", "256")

    def verdict(values: list[float], ok: bool) -> str:
        return ("met" if ok else "missed") + " (" + ", ".join(f"{v:g}" for v in values) + " at c=1, 64, 256)"

    vs_gym = [calls[c]["gymhost_vs_gym_launcher"] for c in levels]
    vs_bare = [calls[c]["gymhost_vs_bare"] for c in levels]
    floor = [calls[c]["plain_fastapi_vs_bare"] for c in levels]
    vs_floor = [calls[c]["gymhost_vs_plain_fastapi"] for c in levels]
    bridge = [ratios["bridge_latency"][c]["p50"] for c in levels]
    held = results["concurrency"]["levels"][-1]
    episodes = results["episodes"]
    one_call = episodes["tool_calls_through_gymhost"][0]["look"]["p50_ms"]
    per_s = episodes["through_gymhost"][1]["episodes_per_s"]
    scale = results.get("scale", {})
    think = scale.get("think_time", {})
    bursts = [scale[key] for key in ("cold_burst_process", "cold_burst_in_process") if key in scale]
    return [
        "**Targets** (ratios from this run):",
        "",
        f"- gymhost tool-call throughput >= 1.5x Gym's own launcher: {verdict(vs_gym, min(vs_gym) >= 1.5)}.",
        f"- gymhost tool-call throughput >= 0.5x the bare limit: {verdict(vs_bare, min(vs_bare) >= 0.5)}."
        f" A plain FastAPI route with the same models and no middleware reaches {', '.join(f'{v:g}' for v in floor)}"
        f" of the limit, and gymhost {', '.join(f'{v:g}' for v in vs_floor)} of that FastAPI floor: every Gym server"
        " is a FastAPI app, so FastAPI's own per-request cost bounds what any way of serving one can reach.",
        f"- Bridge overhead, tool call through the written gridsim server / the same call directly over MCP, <= 1.5x"
        f" at c=1 and 64: {verdict(bridge, bridge[0] <= 1.5 and bridge[1] <= 1.5)} (p50 latency).",
        f"- In-process bridged tool call p50 at one client <= 1.0 ms: {'met' if one_call <= 1.0 else 'missed'}"
        f" ({one_call} ms).",
        f"- Episodes/s at 64 concurrent episodes >= 228 (4x the 57 recorded before the direct path):"
        f" {'met' if per_s >= 228 else 'missed'} ({per_s}).",
        f"- 10,000 open gridsim episodes in one process (in-process instances), zero errors:"
        f" {'met' if ratios.get('max_open_episodes_without_errors', 0) >= 10000 else 'missed'}"
        f" ({held['open_episodes']} open, {held['seed_errors'] + held['call_errors']} errors, tool call p99"
        f" {held['look'].get('p99_ms')} ms with 64 in flight; {ratios.get('rss_kb_per_open_episode_with_its_instance')}"
        f" KB resident per open episode, its instance included).",
        f"- {think.get('episodes')} episodes at once with 0.5 s of think time before each of 4 tool calls, on a folder"
        f" written with default options, 0 errors: {'met' if think and not think['errors'] else 'missed'}"
        f" ({think.get('errors')} errors).",
        *(
            [
                "- HTTP metrics cost under 5% of tool-call throughput: "
                + verdict(cost, min(cost) >= 0.95)
                + " (throughput with / without them)."
            ]
            if (cost := [calls[c].get("with_vs_without_http_metrics") for c in levels]) and None not in cost
            else []
        ),
        "- A cold burst of seeds on a pool at its minimum, all seeded: "
        + ("met" if bursts and all(b["seeded"] == b["seeds"] for b in bursts) else "missed")
        + " ("
        + ", ".join(f"{b['seeded']} of {b['seeds']}" for b in bursts)
        + ").",
        "",
    ]


def tables(results: dict[str, Any], source: str) -> str:
    m = results["machine"]
    packages = ", ".join(f"{name} {version}" for name, version in m["packages"].items())
    lines = [
        f"Run of {results['date']}{' (quick)' if results.get('quick') else ''}: {m['cores']} cores ({m['cpu']}), "
        f"{m['memory_gb']} GiB, Python {m['python']}; {packages}; {m['wrk']}. Raw numbers: [{source}]({source}).",
        "",
        *targets(results),
        "**Tool calls** (`POST /get_weather` on nemo-gym's example_single_tool_call, with a seeded session's cookie;"
        " wrk, one thread, keep-alive):",
        "",
        "| server | c=1 req/s | p50 / p99 ms | c=64 req/s | p50 / p99 ms | c=256 req/s | p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results["tool_calls"].items():
        cells = " | ".join(f"{r['rps']:,.0f} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f}" for r in rows)
        errors = sum(r["errors"] + r["socket_errors"] for r in rows)
        lines.append(f"| {NAMES[name]} | {cells} | {errors} |")
    ratios = results["ratios"]
    lines += ["", "| ratio (throughput) | c=1 | c=64 | c=256 |", "|---|---|---|---|"]
    for key, label in [
        ("gymhost_vs_gym_launcher", "gymhost (uvicorn) / Gym's launcher (target >= 1.5)"),
        ("gymhost_vs_bare", "gymhost (uvicorn) / bare limit (target >= 0.5)"),
        ("hypercorn_vs_gym_launcher", "gymhost (hypercorn) / Gym's launcher"),
        ("gymhost_vs_plain_fastapi", "gymhost (uvicorn) / plain FastAPI route"),
        ("plain_fastapi_vs_bare", "plain FastAPI route / bare limit"),
        ("with_vs_without_http_metrics", "gymhost with / without HTTP metrics (target >= 0.95)"),
    ]:
        if key not in ratios["tool_call_throughput"]["1"]:
            continue  # a run from before this comparison
        lines.append(
            f"| {label} | " + " | ".join(str(ratios["tool_call_throughput"][c][key]) for c in ("1", "64", "256")) + " |"
        )
    episodes = results["episodes"]
    through, calls, direct = episodes["through_gymhost"], episodes["tool_calls_through_gymhost"], episodes["direct_mcp"]
    lines += [
        "",
        "**Episodes** on the written gridsim server (in-process instances; the load generator in its own process):"
        " episodes of seed, 4 tool calls and verify; and, for the bridge's overhead, episodes of 40 tool calls (so"
        " that nearly every worker is in a tool call at any moment) against the same tool call (`gridsim_look`) made"
        " directly to a gridsim environment over MCP by the same number of workers:",
        "",
        "| concurrency | episodes/s | episode p50 / p99 ms | tool call via gymhost p50 / p99 ms"
        " | direct over MCP p50 / p99 ms | latency ratio p50 (mean) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b, d in zip(through, calls, direct, strict=True):
        ratio = ratios["bridge_latency"][str(a["concurrency"])]
        lines.append(
            f"| {a['concurrency']} | {a['episodes_per_s']} | {a['episode']['p50_ms']} / {a['episode']['p99_ms']} | "
            f"{b['look']['p50_ms']} / {b['look']['p99_ms']} | {d['look']['p50_ms']} / {d['look']['p99_ms']} | "
            f"{ratio['p50']} ({ratio['mean']}) | {a['errors'] + b['errors'] + d['errors']} |"
        )
    held = results["concurrency"]
    lines += [
        "",
        "**Open episodes** held by one server process (in-process gridsim instances started as the episodes come, up"
        f" to {held['max_instances']}; the server up in {held['startup_s']} s, {held['baseline_rss_mb']} MB resident"
        " with its 50 first instances); at each level one tool call on every open episode, 64 at a time:",
        "",
        "| open episodes | resident MB | tool call p50 / p99 ms | errors |",
        "|---|---|---|---|",
    ]
    for level in held["levels"]:
        look = level["look"]
        errors = level["seed_errors"] + level["call_errors"]
        lines.append(
            f"| {level['open_episodes']} | {level['rss_mb']} | {look.get('p50_ms')} / {look.get('p99_ms')} | {errors} |"
        )
    lines.append(
        f"\nAll {held['levels'][-1]['open_episodes']} then verified with {held['verify_errors']} errors."
        f" Most open episodes without an error: {ratios.get('max_open_episodes_without_errors')}, at"
        f" {ratios.get('rss_kb_per_open_episode_with_its_instance')} KB resident each, its instance included."
        " ![memory](concurrency.svg)"
    )
    lines += scale_tables(results.get("scale"))
    lines += scale_out_tables(results.get("scale_out"))
    lines += openenv_tables(results.get("openenv"), ratios.get("openenv_bridge_latency"))
    return "\n".join(lines)


def openenv_tables(bridged: dict[str, Any] | None, ratio: dict[str, Any] | None) -> list[str]:
    if not bridged or not ratio:
        return []
    lines = [
        "",
        "**OpenEnv bridge**: the `sums` example served by openenv 0.10.0 (its own process, up to"
        " 16 sessions), written with `gymhost write URL` and served; episodes of 40 `look` tool calls through gymhost"
        " against the same step sent straight over the server's `/ws` by the same number of sessions:",
        "",
        "| sessions | tool call via gymhost p50 / p99 ms | direct over /ws p50 / p99 ms | latency ratio p50 (mean)"
        " | errors |",
        "|---|---|---|---|---|",
    ]
    for a, d in zip(bridged["through_gymhost"], bridged["direct_ws"], strict=True):
        r = ratio[str(a["concurrency"])]
        lines.append(
            f"| {a['concurrency']} | {a['look']['p50_ms']} / {a['look']['p99_ms']} | {d['look']['p50_ms']} /"
            f" {d['look']['p99_ms']} | {r['p50']} ({r['mean']}) | {a['errors'] + d['errors']} |"
        )
    return lines


def load_tables(results: dict[str, Any], source: str) -> str:
    load = results["load"]
    m = results["machine"]
    lines = [
        f"Run of {results['date']}{' (quick)' if results.get('quick') else ''}: {m['cores']} cores ({m['cpu']}), "
        f"{m['memory_gb']} GiB, Python {m['python']}. Raw numbers: [{source}]({source}).",
        "",
        "**Gym's stated load**: bursts of concurrent requests started at once, each on a connection of its own (as"
        " verifiers opens one per call; the client spreads them over loopback source addresses), and keep-alive"
        f" connections ({load['keep_alive_connections']:,} of them, 4 requests each); `POST /get_weather` on"
        " example_single_tool_call, and whole gridsim episodes (seed, 2 tool calls, verify, each request on a new"
        " connection; in-process instances). Every server is started under `prlimit"
        f" --nofile=1024:{load['hard_limit']}` (the usual soft limit, and the highest hard one this machine allows a"
        " process: each server raises its own soft limit), then under 1024:1024, which none can raise; a burst"
        f" larger than one client process may hold is sent by several (`client processes`):",
        "",
        "| server | load | answered 200 | failed (kind: count) | counted by the server | wall s | p50 / p99 ms |"
        " peak MB (idle) | peak descriptors (idle) | client processes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in load["runs"]:
        failed = {kind: n for kind, n in run["outcomes"].items() if kind != "200"}
        failures = ", ".join(f"{kind}: {n:,}" for kind, n in sorted(failed.items())) or "none"
        unit = "connections" if run["mode"] == "keep-alive" else "at once"
        lines.append(
            f"| {run['server']} | {run['size']:,} {unit}, {run['mode']} | {run['ok']:,} of {run['requests']:,} |"
            f" {failures} | {_counted(run.get('counted_by_the_server'))} | {run['wall_s']} |"
            f" {run['p50_ms']} / {run['p99_ms']} |"
            f" {run['peak_rss_mb']} ({run['idle_rss_mb']}) | {run['peak_fds']:,} ({run['idle_fds']}) |"
            f" {run['client_processes']} |"
        )
    held = [r for r in load["runs"] if r["mode"] == "keep-alive" and r["server"] == "gymhost"]
    if held:
        run = held[0]
        per_kb = (run["peak_rss_mb"] - run["idle_rss_mb"]) * 1024 / run["size"]
        per_fd = (run["peak_fds"] - run["idle_fds"]) / run["size"]
        lines += [
            "",
            f"An open connection costs gymhost about {per_kb:.1f} KB and {per_fd:.2f} descriptors (peak over idle,"
            f" across {run['size']:,} keep-alive connections open at once); an open episode's memory, its in-process"
            " instance included, is in the benchmarks' open-episodes table; an in-process episode holds no descriptor"
            " of its own.",
        ]
    return "\n".join(lines)


def _counted(counted: dict[str, float] | None) -> str:
    """The server's own count of connections it could not take, by metric (without the ``gymhost_`` prefix)."""
    if counted is None:
        return "(no such metrics)"
    return ", ".join(f"{name.removeprefix('gymhost_')}: {value:,.0f}" for name, value in sorted(counted.items()))


def scale_tables(scale: dict[str, Any] | None) -> list[str]:
    if not scale:
        return []
    think, process = scale["think_time"], scale["process_mode_64"]
    seed = think["seed"]
    lines = [
        "",
        "**Scale**, on gridsim folders written with default options (the elastic pool: process mode 4 to 256"
        " instances, in-process 4 to 512):",
        "",
        "| measurement | result |",
        "|---|---|",
        f"| {think['episodes']} episodes at once, {think['think_s']} s of think time before each of"
        f" {think['calls']} tool calls (process mode) | {think['errors']} errors in {think['seconds']} s; pool peak"
        f" {think['peak_instances']} instances; seed p50 / p99 {seed.get('p50_ms')} / {seed.get('p99_ms')} ms;"
        f" {think['peak_rss_mb']} MB at the peak (proportional set size of the server, its template and instances) |",
    ]
    for key, label in (("cold_burst_process", "process mode"), ("cold_burst_in_process", "in-process")):
        burst = scale.get(key)
        if burst:
            lines.append(
                f"| cold burst of {burst['seeds']} seeds on a pool at its minimum, {label} | {burst['seeded']}"
                f" seeded, {burst['errors']} errors; the last seeded after {burst['last_seed_s']} s (median"
                f" {burst['median_seed_s']} s) |"
            )
    for key, label in (("process_mode_64", "process mode"), ("in_process_mode_64", "in-process")):
        played = scale.get(key)
        if not played:
            continue
        instances = played.get("instances_cpu_ms_per_request")
        lines.append(
            f"| {label}, 64 concurrent episodes of 40 tool calls | {played['calls_per_s']} bridged calls/s,"
            f" tool call p50 / p99 {played['look'].get('p50_ms')} / {played['look'].get('p99_ms')} ms; gymhost's own"
            f" CPU {played['gymhost_cpu_ms_per_request']} ms a request"
            + (
                f" ({played.get('instances_cpu_of', 'instance processes')}: {instances} ms)"
                if instances and key == "process_mode_64"
                else ""
            )
            + f"; {played['errors']} errors |"
        )
    inside = scale.get("in_process_mode_64")
    if inside and inside.get("calls_per_s"):
        lines.append(
            f"| process mode / in-process, calls/s at 64 episodes (one run) |"
            f" {process['calls_per_s'] / inside['calls_per_s']:.2f}x |"
        )
    return lines


def scale_out_tables(out: dict[str, Any] | None) -> list[str]:
    if not out:
        return []
    calls, played = out["tool_calls"], out["episodes"]
    lines = [
        "",
        "**Scale-out** on this one two-core machine, where the load generator shares the cores with the servers: a"
        " second worker can at best take the other core from the load generator, so the ratios show the cost of"
        " several processes (and of forwarding) more than the gain several cores would bring:",
        "",
        "| measurement | --workers 1 | --workers 2 | ratio |",
        "|---|---|---|---|",
    ]
    for index, label in ((0, "tool calls/s, one connection"), (1, "tool calls/s, 64 connections")):
        one, two = calls["1"][index]["rps"], calls["2"][index]["rps"]
        lines.append(f"| {label} (wrk, one seeded session) | {one:,.0f} | {two:,.0f} | {two / one:.2f} |")
    one, two = played["1"]["episodes_per_s"], played["2"]["episodes_per_s"]
    lines.append(f"| episodes/s, 64 at once (gridsim, in-process) | {one} | {two} | {two / one:.2f} |")
    direct, front = out["one_replica_direct"], out["haproxy_3_replicas"]
    if out["forwarded_mean_ms"] is None:
        forward = (
            f"At one connection, wrk's one keep-alive connection reached the worker holding its session (accepted"
            f" there, or handed to it), so no request was forwarded in this run (the owner answered in"
            f" {out['owner_mean_ms']} ms on average, from the servers' own metrics); the forward's cost is in the"
            " workers table, `--no-hand-off`."
        )
    else:
        forward = (
            f"At one connection, a request forwarded to the worker holding its session took"
            f" {out['forwarded_mean_ms']} ms on average, end to end on the receiving worker, where the owner answered"
            f" its own in {out['owner_mean_ms']} ms (means from the servers' own metrics): the forward's cost is the"
            " difference. (With one keep-alive connection, wrk's throughput depends on which worker accepted it: all"
            " its requests are forwarded, or none.)"
        )
    lines += [
        "",
        forward + " Three replicas behind HAProxy with the deploy/ recipe played"
        f" {front['episodes_per_s']} episodes/s ({front['errors']} errors) where one replica alone played"
        f" {direct['episodes_per_s']} ({direct['errors']} errors), on the same two cores.",
    ]
    return lines


def workers_tables(out: dict[str, Any], source: str) -> str:
    """``--workers 2`` (handing connections off, and forwarding instead) against ``--workers 1``, with the targets."""
    variants = out["variants"]
    one, two, forward = variants["1"], variants["2"], variants["2 forward"]
    lines = [
        f"From [{source}]({source}): {out['episodes']} gridsim episodes of {out['calls_per_episode']} tool calls,"
        " 64 at once, every request on a connection of its own as verifiers sends them; the variants interleaved"
        f" over {out['rounds']} round(s), the median round's figures. CPU is the server's whole process tree"
        " (supervisor and workers), from `/proc`.",
        "",
        "| | requests/s | CPU a request | vs --workers 1: CPU / requests/s | misdirected, handed off | forwarded"
        " | tool call p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, variant in (("`--workers 1`", one), ("`--workers 2` (hand-off)", two),
                           ("`--workers 2 --no-hand-off`", forward)):  # fmt: skip
        ratio = (
            f"{variant['cpu_vs_one_worker']:.2f}x / {variant['rps_vs_one_worker']:.2f}x" if variant is not one else ""
        )
        lines.append(
            f"| {label} | {variant['requests_per_s']:,.0f} | {variant['cpu_ms_per_request']:.3f} ms | {ratio}"
            f" | {variant['handed_off']:,.0f} | {variant['forwarded']:,.0f} | {variant['look_p50_ms']} /"
            f" {variant['look_p99_ms']} | {variant['errors']} |"
        )

    def met(ok: bool) -> str:
        return "met" if ok else "missed"

    lines += [
        "",
        f"- CPU a request, `--workers 2` / `--workers 1` <= 1.1x: {met(two['cpu_vs_one_worker'] <= 1.1)}"
        f" ({two['cpu_vs_one_worker']:.2f}x; forwarding instead: {forward['cpu_vs_one_worker']:.2f}x).",
        f"- requests/s, `--workers 2` / `--workers 1` >= 1.0: {met(two['rps_vs_one_worker'] >= 1.0)}"
        f" ({two['rps_vs_one_worker']:.2f}x; forwarding instead: {forward['rps_vs_one_worker']:.2f}x).",
        f"- One misdirected request's CPU beyond one served where it landed: handed off"
        f" {two['extra_us_per_misdirected']} us, forwarded {forward['extra_us_per_misdirected']} us (the extra CPU a"
        " request of the variant over `--workers 1`, over the share misdirected: an upper bound, since it also holds"
        " what a second process costs, its metrics shared through files included).",
    ]
    alone = out.get("one_hand_off")
    if alone:
        lines.append(
            f"- One hand-off alone, measured in one process with the real classes and sockets (serving a connection"
            f" where it landed: {alone['served_here_us']} us; handing it to the sibling's receiver instead:"
            f" {alone['handed_off_us']} us): {alone['one_hand_off_us']} us of CPU. The rest of the upper bound above"
            " is the second worker: two processes and the load generator on two cores, and prometheus_client's"
            " multiprocess mode (a `getpid` and an mmap write per metric update)."
        )
    return "\n".join(lines)


def written_tables(out: dict[str, Any], source: str) -> str:
    """A written server's tool call beside its bare endpoint (and, when measured, the revision before)."""
    ratios = out["gymhost_vs_bare"]
    met = min(ratios.values()) >= 0.6
    levels = list(ratios)
    names = {"bare": "(a) bare endpoint, the same call (limit)", "gymhost": "(b) `gymhost serve`, this checkout"}
    if out.get("baseline"):
        names["baseline"] = f"(c) `gymhost serve`, {out['baseline']} (the revision compared with)"
    lines = [
        f"`POST /gridsim_look` of one seeded episode, gridsim written in-process; wrk, one thread, keep-alive,"
        f" {out['seconds']} s a point, the median of {out['rounds']} interleaved rounds (raw numbers:"
        f" [{source}]({source})). gymhost >= 0.6x the bare endpoint: {'met' if met else 'missed'}"
        f" ({', '.join(f'{ratios[c]:g}' for c in levels)} at c={', '.join(levels)}).",
        "",
        "| server | " + " | ".join(f"c={c} req/s | p50 / p99 ms" for c in levels) + " | CPU a request, µs (c=64) |",
        "|---|" + "---|---|" * len(levels) + "---|",
    ]
    for name, label in names.items():
        rows = out["servers"][name]
        cells = " | ".join(f"{rows[c]['rps']:,.0f} | {rows[c]['p50_ms']:g} / {rows[c]['p99_ms']:g}" for c in levels)
        lines.append(f"| {label} | {cells} | {rows['64']['cpu_us_per_request']:g} |")
    lines += ["", "| ratio (throughput) | " + " | ".join(f"c={c}" for c in levels) + " |"]
    lines.append("|---|" + "---|" * len(levels))
    lines.append("| (b) / (a), target >= 0.6 | " + " | ".join(f"{ratios[c]:g}" for c in levels) + " |")
    if out.get("baseline"):
        before = out["gymhost_vs_baseline"]
        lines.append("| (b) / (c), this checkout / before | " + " | ".join(f"{before[c]:g}" for c in levels) + " |")
    return "\n".join(lines)


def process_mode_tables(out: dict[str, Any], source: str) -> str:
    """Process mode beside in-process mode, each on this checkout and (when measured) on the revision before."""
    ratio = out["process_vs_in_process"]["checkout"]
    revisions = ["checkout"] + (["baseline"] if out.get("baseline") else [])
    labels = {"checkout": "this checkout", "baseline": f"{out.get('baseline')} (the revision compared with)"}
    lines = [
        f"64 concurrent gridsim episodes of 40 tool calls on a pool grown to 64 (folders written with default"
        f" options), each server's median of {out['rounds']} interleaved rounds (raw numbers: [{source}]({source}))."
        f" Process mode >= 0.7x in-process mode's calls/s: {'met' if ratio['median'] >= 0.7 else 'missed'}"
        f" ({ratio['median']:g}; rounds {', '.join(f'{r:g}' for r in ratio['rounds'])}).",
        "",
        "| server | calls/s | the server's CPU a request | the rest of the machine's CPU a request (instance"
        " processes, their starts and exits, the kernel's work; in-process mode's is the floor) |",
        "|---|---|---|---|",
    ]
    rows = [
        (f"{revision} {mode}", f"{mode} mode, {labels[revision]}")
        for revision in revisions
        for mode in ("process", "in-process")
    ]
    if "checkout process, instances reused" in out["servers"]:
        rows.append(("checkout process, instances reused", "process mode, instances reused, this checkout"))
    for name, label in rows:
        row = out["servers"][name]
        lines.append(
            f"| {label} | {row['calls_per_s']:,.0f} | {row['gymhost_cpu_ms_per_request']:g} ms |"
            f" {row['instances_cpu_ms_per_request']:g} ms |"
        )
    lines += ["", "| ratio (calls/s, median of the rounds' ratios) | median | rounds |", "|---|---|---|"]
    for revision in revisions:
        each = out["process_vs_in_process"][revision]
        lines.append(
            f"| process / in-process, {labels[revision]}{', target >= 0.7' if revision == 'checkout' else ''} |"
            f" {each['median']:g} | {', '.join(f'{r:g}' for r in each['rounds'])} |"
        )
    reused = out.get("reused_vs_in_process")
    if reused:
        lines.append(
            f"| process, instances reused / in-process, this checkout | {reused['median']:g} |"
            f" {', '.join(f'{r:g}' for r in reused['rounds'])} |"
        )
    for mode, each in (out.get("checkout_vs_baseline") or {}).items():
        lines.append(
            f"| {mode} mode, this checkout / {out['baseline']} | {each['median']:g} |"
            f" {', '.join(f'{r:g}' for r in each['rounds'])} |"
        )
    return "\n".join(lines)


def _in_turn(out: dict[str, Any]) -> str:
    """How a confinement run's starts were taken: the two ways in turn (since 2026-12-06), or each all at once."""
    return ", the two ways in turn" if out.get("starts_in_turn") else ""


def confinement_tables(out: dict[str, Any], source: str) -> str:
    """Confined process instances (``--sandbox strict``) beside unconfined ones (``off``), against issue 43's
    targets."""

    def verdict(ratio: float, target: float, above: bool) -> str:
        return "met" if (ratio >= target if above else ratio <= target) else "missed"

    calls, batch, starts = out["calls_ratio"], out["batch_p99_ratio"], out["start_p99_ratio"]
    lines = [
        f"gridsim written with default options (process mode), confined and not (raw numbers: [{source}]({source})):"
        f" 64 concurrent episodes of 40 tool calls, each server's median of {out['rounds']} interleaved rounds;"
        f" {out['episodes']} think-time episodes at once on an idle default pool (ready, then sent nothing for a"
        f" second: `run.idle_pool`), the median of"
        f" {out['batch_rounds']} interleaved rounds; 40 instance starts one after another{_in_turn(out)}.",
        "",
        "| | confined (`--sandbox strict`) | unconfined (`--sandbox off`) | ratio | target |",
        "|---|---|---|---|---|",
        f"| tool calls/s | {out['calls']['strict']['calls_per_s']:,.0f} | {out['calls']['off']['calls_per_s']:,.0f} |"
        f" {calls['median']:g} (rounds {', '.join(f'{r:g}' for r in calls['rounds'])}) |"
        f" >= 0.9: {verdict(calls['median'], 0.9, True)} |",
    ]
    if "fresh_ratio" in out:
        fresh = out["fresh_ratio"]
        lines.append(
            f"| tool calls/s, confined, reused instances (`fresh_instances: false`) beside fresh ones |"
            f" {out['calls']['reused']['calls_per_s']:,.0f} | | {fresh['median']:g} fresh/reused (rounds"
            f" {', '.join(f'{r:g}' for r in fresh['rounds'])}): {out['fresh_ms_per_episode']:g} ms of the two"
            " cores an episode | |"
        )
    p99 = {sandbox: out["batch"][sandbox]["think_time"]["seed"].get("p99_ms") for sandbox in ("strict", "off")}
    lines.append(
        f"| cold batch, seed p99 | {p99['strict']} ms | {p99['off']} ms |"
        f" {batch['median']:g} (rounds {', '.join(f'{r:g}' for r in batch['rounds'])}) |"
        f" <= 1.2: {verdict(batch['median'], 1.2, False)} |"
    )
    strict, off = out["starts"]["strict"], out["starts"]["off"]
    lines += [
        f"| instance start, p50 / p99 | {strict['wall_p50_ms']} / {strict['wall_p99_ms']} ms |"
        f" {off['wall_p50_ms']} / {off['wall_p99_ms']} ms | {starts:g} (p99) | <= 2: {verdict(starts, 2.0, False)} |",
        f"| instance start, CPU in the template / the instance / the server | {strict['template_cpu_ms']} /"
        f" {strict['instance_cpu_ms']} / {strict['server_cpu_ms']} ms | {off['template_cpu_ms']} /"
        f" {off['instance_cpu_ms']} / {off['server_cpu_ms']} ms | | |",
        f"| an idle instance's PSS | {strict['idle_instance_pss_mb']} MB | {off['idle_instance_pss_mb']} MB | | |",
    ]
    return "\n".join(lines)


def confined_server_tables(out: dict[str, Any], source: str) -> str:
    """A Gym server's own process confined (``--sandbox strict``) beside unconfined (``off``): issue 43, item 4."""
    strict, off, rps, start = out["strict"], out["off"], out["rps_ratio"], out["start_ratio"]
    met = "met" if rps["median"] >= 0.9 else "missed"

    def rounds(ratios: dict[str, Any]) -> str:
        return ", ".join(f"{r:g}" for r in ratios["rounds"])

    return "\n".join(
        [
            f"Gym's example_single_tool_call served each way, both started afresh in each of {out['rounds']}"
            f" interleaved rounds (raw numbers: [{source}]({source})); wrk at 64 connections for {out['seconds']} s"
            f" on one episode's `get_weather`. Tool calls/s >= 0.9x unconfined: {met} ({rps['median']:g}, rounds"
            f" {rounds(rps)}).",
            "",
            "| | confined (`--sandbox strict`) | unconfined (`--sandbox off`) | ratio |",
            "|---|---|---|---|",
            f"| tool calls/s | {strict['rps']:,.0f} | {off['rps']:,.0f} | {rps['median']:g} (rounds {rounds(rps)}) |",
            f"| tool call p99 | {strict['p99_ms']:g} ms | {off['p99_ms']:g} ms | |",
            f"| start to ready | {strict['start_ms']:,.0f} ms | {off['start_ms']:,.0f} ms | {start['median']:g}"
            f" (rounds {rounds(start)}) |",
            f"| resident memory, every process, ready | {strict['ready_mb']:g} MB | {off['ready_mb']:g} MB |"
            f" +{out['memory_added_mb']:g} MB |",
            f"| resident memory, after the calls | {strict['after_calls_mb']:g} MB | {off['after_calls_mb']:g} MB | |",
            f"| errors | {strict['errors']} | {off['errors']} | |",
        ]
    )


def cold_start_tables(out: dict[str, Any], source: str) -> str:
    """A cold batch and one start, instances constructed once in the template beside each constructing its own."""
    each, once = out["construct_each"], out["construct_once"]
    p99 = once["think_time"]["seed"].get("p99_ms") or float("inf")  # no seed answered: no p99, and missed
    lines = [
        f"{out['episodes']} think-time episodes at once on an idle default pool (process mode, 4 instances up, a second"
        f" idle: `run.idle_pool`), the"
        f" round with the median seed p99 of {out['rounds']} interleaved rounds; then 40 instance starts one after"
        f" another (raw numbers: [{source}]({source})). Seed p99 <= 2 s: {'met' if p99 <= 2000 else 'missed'}"
        f" ({p99 / 1000:.2f} s; {out['p99_once_vs_each']}x the p99 with each instance constructing its own).",
        "",
        "| written gridsim server, default options | each instance constructs its own | constructed once, in the"
        " template |",
        "|---|---|---|",
    ]

    def row(label: str, value: Any) -> None:
        lines.append(f"| {label} | {value(each)} | {value(once)} |")

    row("seed p50 / p99, ms", lambda v: "{p50_ms:,.0f} / {p99_ms:,.0f}".format(**v["think_time"]["seed"]))
    row("seed p99 of each round, ms", lambda v: ", ".join(f"{p:,.0f}" for p in v["seed_p99_ms_of_each_round"]))
    row("pool peak, instances", lambda v: v["think_time"]["peak_instances"])
    row("errors", lambda v: v["think_time"]["errors"])
    row("one start, until it answers its card", lambda v: f"{v['starts']['wall_ms']:g} ms")
    row(
        "CPU of one start: instance / template / server",
        lambda v: (
            f"{v['starts']['instance_cpu_ms']:g} / {v['starts']['template_cpu_ms']:g} /"
            f" {v['starts']['server_cpu_ms']:g} ms"
        ),
    )
    row("an idle instance's own memory (PSS)", lambda v: f"{v['starts']['idle_instance_pss_mb']:g} MB")
    row("CPU an episode in the batch: " + _BATCH_CPU_LABEL, lambda v: _batch_cpu(v["think_time"]))
    before = out.get("baseline")
    if before is not None:
        revision = before["revision"]
        lines += [
            "",
            f"| the same batch, default pool | this checkout | {revision} (the revision compared with) |",
            "|---|---|---|",
            "| seed p50 / p99, ms | " + " | ".join(
                "{p50_ms:,.0f} / {p99_ms:,.0f}".format(**v["think_time"]["seed"]) for v in (once, before)
            ) + " |",
            "| seed p99 of each round, ms | " + " | ".join(
                ", ".join(f"{p:,.0f}" for p in v["seed_p99_ms_of_each_round"]) for v in (once, before)
            ) + " |",
            f"| pool peak, instances; errors | {once['think_time']['peak_instances']};"
            f" {once['think_time']['errors']} | {before['think_time']['peak_instances']};"
            f" {before['think_time']['errors']} |",
            f"| CPU an episode in the batch: {_BATCH_CPU_LABEL} | {_batch_cpu(once['think_time'])} |"
            f" {_batch_cpu(before['think_time'])} |",
            f"| seed p99, this checkout / {revision} | {out['p99_vs_baseline']} | |",
        ]  # fmt: skip
    return "\n".join(lines)


_BATCH_CPU_LABEL = "server / template, of it the kernel's / the machine's, ms"


def _batch_cpu(think: dict[str, Any]) -> str:
    """The median round's CPU an episode (``run.cold_start``): the server's, the template's with its system share,
    and the whole machine's (instances and load generator included), where the round recorded them."""
    cpu = think.get("cpu_ms_an_episode")
    if not cpu:
        return "(not recorded)"
    machine = cpu.get("machine")
    return (
        f"{cpu['server']:g} / {cpu['template_user'] + cpu['template_system']:.2f}, {cpu['template_system']:g}"
        f" / {'(not recorded)' if machine is None else f'{machine:g}'}"
    )


def hypercorn_tables(out: dict[str, Any], source: str) -> str:
    """hypercorn on each loop at 256 connections: the tail beside the throughput."""
    ratio = out["p99_vs_hypercorn_asyncio"]
    lines = [
        f"At {out['connections']} connections, {out['seconds']} s a round (wrk, one thread, keep-alive, 10 s"
        f" timeout; raw numbers: [{source}]({source})). p99 of `gymhost serve --server hypercorn` within 2x"
        f" `hypercorn asgi:app`'s: {'met' if ratio <= 2 else 'missed'} ({ratio}x).",
        "",
        "| server | req/s | p50 ms | p99 ms | max ms (worst round) | p99 of each round ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in out["servers"].items():
        rounds = ", ".join(f"{r['p99_ms']:g}" for r in row["rounds"])
        lines.append(
            f"| {HYPERCORN_NAMES[name]} | {row['rps']:,.0f} | {row['p50_ms']:g} | {row['p99_ms']:g} |"
            f" {row['max_ms']:g} | {rounds} | {row['errors']} |"
        )
    return "\n".join(lines)


def layers_tables(out: dict[str, Any], source: str) -> str:
    """Each layer's microseconds, alone and taken out (and, from 2026-12-03 on, alone in front of an app that answers
    at once, and the plumbing of as many layers that only pass the call on), and the whole stack against FastAPI's
    floor."""
    us = out["us_per_call"]
    none, whole, floor = us["none"], us["all"], us["floor"]
    added = whole - none
    met = added <= floor / 10
    hot = us.get("on_nothing", {})
    lines = [
        f"One seeded episode's `POST /get_weather` on example_single_tool_call, driven in-process with ASGI messages"
        f" (no server); the fastest of {out['rounds']} rounds of {out['calls']:,} calls (raw numbers:"
        f" [{source}]({source})). gymhost's layers together <= a tenth of a plain FastAPI route's cost:"
        f" {'met' if met else 'missed'} ({added:.1f} µs against {floor / 10:.1f}, a tenth of {floor:.0f} µs)."
        f" Gym's app with no middleware at all takes {none:.0f} µs a call, {none / floor:.2f}x the FastAPI"
        " route's time.",
        "",
        "| layer (outermost first) | alone: µs it adds to Gym's app | taken out of the whole stack: µs saved |"
        + (" alone, in front of an app that answers at once: µs |" if hot else ""),
        "|---|---|---|" + ("---|" if hot else ""),
    ]
    for name in out["stack"]:
        cells = f"| `{name}` | {us['alone'][name] - none:.1f} | {whole - us['all_but'][name]:.1f} |"
        lines.append(cells + (f" {hot[name] - us['nothing']:.1f} |" if hot else ""))
    total = sum(hot[name] - us["nothing"] for name in out["stack"]) if hot else 0.0
    lines.append(f"| the whole stack | {added:.1f} | |" + (f" {total:.1f} (the sum) |" if hot else ""))
    if "plumbing" in us:
        plumbing = us["plumbing"] - none
        row = f"| {len(out['stack'])} layers that only pass the call on (the plumbing) | {plumbing:.1f} | |"
        lines.append(row + (" |" if hot else ""))
    return "\n".join(lines)


def request_profile_tables(out: dict[str, Any], source: str) -> str:
    """Each server's CPU a call under wrk, split by piece from py-spy's samples, and gymhost's pieces together
    against a tenth of the FastAPI route's."""
    servers = out["servers"]
    gymhost, alone, floor = servers.values()  # request_profile.measure's order: gymhost, Gym's app alone, the route
    added = sum(gymhost["us_per_request"].get(piece, 0.0) for piece in out["gymhost_pieces"])
    tenth = floor["cpu_us_per_request"] / 10
    more = gymhost["cpu_us_per_request"] - alone["cpu_us_per_request"]
    lines = [
        f"`POST /get_weather` of one seeded episode on example_single_tool_call, wrk at {out['connections']}"
        f" connections, {out['rounds']} rounds of {out['seconds']} s a server, py-spy sampling {out['rate']} times a"
        f" second from outside; a piece's share of the samples times the server's CPU a call (the median round's,"
        f" from `/proc`; raw numbers: [{source}]({source})). gymhost's pieces together <= a tenth of the FastAPI"
        f" route's CPU a call: {'met' if added <= tenth else 'missed'} ({added:.1f} µs against {tenth:.1f} µs)."
        f" In all, `gymhost serve` took {more:.0f} µs a call more than Gym's app alone: {added:.1f} in its pieces,"
        f" {more - added:+.1f} in the others.",
        "",
        "| piece, µs a call | " + " | ".join(servers) + " |",
        "|---|" + "---|" * len(servers),
    ]
    for piece in out["pieces"]:
        label = f"`{piece}`" if piece in out["layers"] else piece
        cells = " | ".join(f"{server['us_per_request'].get(piece, 0.0):.1f}" for server in servers.values())
        lines.append(f"| {label} | {cells} |")
    lines.append(f"| gymhost's pieces together | {added:.1f} |" + " |" * (len(servers) - 1))
    lines.append(
        "| the server's CPU a call | " + " | ".join(f"{s['cpu_us_per_request']:.0f}" for s in servers.values()) + " |"
    )
    lines.append("| samples | " + " | ".join(f"{s['samples']:,}" for s in servers.values()) + " |")
    return "\n".join(lines)


def update_readme(results: dict[str, Any], readme: Path, source: str) -> None:
    """The tables of a full run between the results markers, and its load section (when it has one) between the
    load markers; a run of the load section alone (no ``tool_calls``) rewrites only the latter."""
    text = readme.read_text()
    if "tool_calls" in results:
        text = _replace(text, START, END, tables(results, source))
    if "load" in results:
        text = _replace(text, LOAD_START, LOAD_END, load_tables(results, source))
    if "workers" in results:
        text = _replace(text, WORKERS_START, WORKERS_END, workers_tables(results["workers"], source))
    if "hypercorn" in results:
        text = _replace(text, HYPERCORN_START, HYPERCORN_END, hypercorn_tables(results["hypercorn"], source))
    if "written" in results:
        text = _replace(text, WRITTEN_START, WRITTEN_END, written_tables(results["written"], source))
    if "cold_start" in results:
        text = _replace(text, COLD_START, COLD_END, cold_start_tables(results["cold_start"], source))
    if "layers" in results:
        text = _replace(text, LAYERS_START, LAYERS_END, layers_tables(results["layers"], source))
    if "process_mode" in results:
        text = _replace(text, PROCESS_START, PROCESS_END, process_mode_tables(results["process_mode"], source))
    if "request_profile" in results:
        text = _replace(text, PROFILE_START, PROFILE_END, request_profile_tables(results["request_profile"], source))
    if "confinement" in results:
        text = _replace(text, CONFINEMENT_START, CONFINEMENT_END, confinement_tables(results["confinement"], source))
    if "confined_server" in results:
        block = confined_server_tables(results["confined_server"], source)
        text = _replace(text, CONFINED_SERVER_START, CONFINED_SERVER_END, block)
    readme.write_text(text)


def _replace(text: str, start: str, end: str, block: str) -> str:
    head, found, rest = text.partition(start)
    if not found:
        raise ValueError(f"no {start} marker")
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n{block}\n{end}{tail}"


def write_plot(results: dict[str, Any], path: Path) -> None:
    """Resident memory against open episodes, as a small SVG line chart (no plotting library needed)."""
    levels = results["concurrency"]["levels"]
    points = [(0, results["concurrency"]["baseline_rss_mb"])] + [(lv["open_episodes"], lv["rss_mb"]) for lv in levels]
    width, height, pad = 480, 280, 48
    max_x = max(x for x, _ in points) or 1
    low, high = min(y for _, y in points) * 0.95, max(y for _, y in points) * 1.05

    def xy(x: float, y: float) -> str:
        left = pad + x / max_x * (width - 2 * pad)
        top = height - pad - (y - low) / (high - low) * (height - 2 * pad)
        return f"{left:.1f},{top:.1f}"

    line = " ".join(xy(x, y) for x, y in points)
    dots = "".join(f'<circle cx="{xy(x, y).split(",")[0]}" cy="{xy(x, y).split(",")[1]}" r="3"/>' for x, y in points)
    labels = "".join(
        f'<text x="{xy(x, y).split(",")[0]}" y="{float(xy(x, y).split(",")[1]) - 8:.1f}" font-size="10" '
        f'text-anchor="middle">{y:.0f}</text>'
        for x, y in points
    )
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>'
        f'<polyline points="{line}" fill="none" stroke="steelblue" stroke-width="2"/>{dots}{labels}'
        f'<text x="{width / 2}" y="{height - 12}" font-size="12" text-anchor="middle">'
        f"open episodes (0 to {max_x})</text>"
        f'<text x="14" y="{height / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {height / 2})">resident memory, MB ({low:.0f} to {high:.0f})</text></svg>\n'
    )
