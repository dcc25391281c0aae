"""The ``gymhost`` command line.

Every error gymhost raises on purpose ends the command with one ``Error: ...`` line and exit status 1; a
traceback means a bug in gymhost. Nothing here imports nemo-gym until a command needs it, so ``--help`` and
the install hint work in an environment without it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from ._config import (
    DEFAULT_MAX_BODY_BYTES,
    MASKED_VERDICTS,
    MASKED_VERDICTS_ENV_VAR,
    NO_TOKEN,
    PARENT_PID_ENV_VAR,
    REPLICA_ENV_VAR,
    SERVERS,
    TOKEN_ENV_VAR,
    AppSettings,
    ServeConfig,
)
from ._exceptions import GymhostError
from ._keys import MOUNT
from ._version import __version__
from .environments._settings import SourceConfig, parse_instances

__all__ = ["main"]


def _key_values(option: str, values: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise click.BadParameter(f"expected NAME=VALUE, got {value!r}", param_hint=option)
        pairs[key] = rest
    return pairs


def _overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """``--set a.b=1`` as nested config values, typed the way Gym's own command-line overrides are."""
    if not values:
        return {}
    _key_values("--set", values)  # the same NAME=VALUE check as --server-url
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.from_dotlist(list(values)))
    assert isinstance(container, dict)
    return {str(key): value for key, value in container.items()}


def _instances(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_instances(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
    return value


class _InstancesOption(click.Option):
    """``--instances``, whose help names each source kind's default, read from the backends when the help is shown
    (so ``gymhost --help`` imports none of them)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:
            return None
        from .environments._registry import BACKENDS

        defaults = ", ".join(
            f"{low}:{high} {backend.kind}{f' {mode}' if mode else ''}".replace("_", "-")
            for backend in BACKENDS
            for mode, (low, high) in backend.default_instances.items()
        )
        return record[0], f"{record[1]} Default: {defaults}."


class _WriteByDefault(click.Group):
    """``gymhost SOURCE ROOT`` means ``gymhost write SOURCE ROOT``: a first argument that is not a command (or
    the group's own --help/--version) is handed to ``write``, options before SOURCE included."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help", "--version"):
            args = ["write", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_WriteByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gymhost")
def main() -> None:
    """Host NeMo Gym resources servers as standalone ASGI apps, and write agent environments as Gym servers.

    A first argument that is not a command runs `write`: `gymhost SOURCE ROOT`.
    """


@main.command()
@click.argument("folder", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.option(
    "--host",
    default=ServeConfig.host,
    show_default=True,
    help="Address to listen on. Beyond loopback, set a token (GYMHOST_TOKEN or --token): without one, anyone who "
    "reaches the port can play and read episodes.",
)
@click.option(
    "--port", default=ServeConfig.port, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port."
)
@click.option("--server", "server_name", type=click.Choice(SERVERS), default=ServeConfig.server, show_default=True)
@click.option(
    "--server-url",
    "server_urls",
    multiple=True,
    metavar="NAME=URL",
    help="Where a Gym server this one calls by name (a judge, a policy model) listens. Repeatable.",
)
@click.option("--name", default=None, help="Runtime server name (default: the config's top-level key).")
@click.option("--config-key", default=None, help="Top-level config key, when the configs hold several servers.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Override a config field. Repeatable.")
@click.option(
    "--log-level",
    default=ServeConfig.log_level,
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.option(
    "--access-log/--no-access-log", default=ServeConfig.access_log, show_default=True, help="A log line per request."
)
@click.option(
    "--token",
    envvar=TOKEN_ENV_VAR,
    default=None,
    show_envvar=True,
    help="Every request but liveness probes must send Authorization: Bearer TOKEN. Prefer the environment "
    "variable: a command line is visible to every user of the machine.",
)
@click.option(
    "--max-body-bytes",
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    type=click.IntRange(1),
    help="Larger request bodies are refused with 413.",
)
@click.option(
    "--masked-verdicts",
    envvar=MASKED_VERDICTS_ENV_VAR,
    show_envvar=True,
    type=click.Choice(MASKED_VERDICTS),
    default=AppSettings.masked_verdicts,
    show_default=True,
    help="How a verdict the server masked (the episode was lost, not failed by the model) reaches the client. refuse: "
    "an HTTP error naming the failure, so every client fails the rollout (verifiers never reads mask_sample and "
    "would train on the 0.0 of a 200). answer: a 200 with mask_sample true, for clients that read it (Gym 0.5+'s "
    "rollout collection, which aborts on an error).",
)
@click.option(
    "--drain-timeout",
    envvar="GYMHOST_DRAIN_TIMEOUT",
    show_envvar=True,
    default=ServeConfig.drain_timeout,
    show_default=True,
    type=click.IntRange(0),
    help="On SIGTERM/SIGINT: seconds open episodes get to end (no new ones are taken) before the shutdown. A second "
    "signal stops at once. Under Kubernetes, set terminationGracePeriodSeconds above this plus --graceful-timeout.",
)
@click.option(
    "--replica-id",
    envvar=REPLICA_ENV_VAR,
    show_envvar=True,
    default=None,
    help="This replica's name, written into every session and MCP token it signs (default: host:port). Sessions "
    "of another replica, or of an earlier start of this one, are refused as lost, never served as new.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Worker processes on this host, each holding the episodes it seeded; a request reaches the worker that "
    "holds its episode whichever accepts it. Workers share one GYMHOST_SECRET (made for them if unset).",
)
@click.option(
    "--hand-off/--no-hand-off",
    default=ServeConfig.hand_off,
    show_default=True,
    help="With --workers: a connection reaching a worker that does not hold its episode is handed to the one that "
    "does (the connection itself); --no-hand-off forwards its requests through the worker that accepted it.",
)
@click.option(
    "--advertise-url",
    default=None,
    metavar="URL",
    help="Where other replicas reach this one (http://HOST:PORT, behind no load balancer): written into its "
    "sessions, so a replica that receives one of them forwards the request here instead of refusing it.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=ServeConfig.log_format,
    show_default=True,
    help="json: one JSON object a line, with an episode's ids, outcome and durations on the line of its end.",
)
@click.option(
    "--http-metrics/--no-http-metrics",
    default=True,
    show_default=True,
    help="Time every request for /metrics (http_server_request_duration_seconds).",
)
@click.option(
    "--graceful-timeout",
    default=ServeConfig.graceful_timeout,
    show_default=True,
    type=click.IntRange(0),
    help="Seconds requests in flight get to finish on SIGTERM/SIGINT before they are cancelled.",
)
@click.option(
    "--venv",
    is_flag=True,
    help="A folder whose requirements.txt this environment does not meet is served from a venv of its own, built "
    "once (with uv when it is on PATH, as Gym builds them) with this nemo-gym and gymhost; under a Gym root, each such "
    "folder by a process of its own behind this one, at its prefix.",
)
@click.option("--uds", default=None, metavar="PATH", help="Listen on a Unix socket at PATH instead of --host/--port.")
@click.option(
    "--backlog",
    default=ServeConfig.backlog,
    show_default=True,
    type=click.IntRange(1),
    help="Connections queued before they are accepted (a burst of connects; the kernel caps it at net.core.somaxconn).",
)
@click.option(
    "--root-path",
    default=ServeConfig.root_path,
    metavar="PREFIX",
    help="The path prefix a proxy in front serves this server under (its cookies and MCP paths are the prefix's).",
)
def serve(
    folder: str,
    host: str,
    port: int,
    server_name: str,
    server_urls: tuple[str, ...],
    name: str | None,
    config_key: str | None,
    settings: tuple[str, ...],
    log_level: str,
    access_log: bool,
    token: str | None,
    max_body_bytes: int,
    masked_verdicts: str,
    drain_timeout: int,
    replica_id: str | None,
    workers: int,
    hand_off: bool,
    advertise_url: str | None,
    log_format: str,
    http_metrics: bool,
    graceful_timeout: int,
    venv: bool,
    uds: str | None,
    backlog: int,
    root_path: str,
) -> None:
    """Serve the resources server in FOLDER (which may be '.').

    When FOLDER is a Gym root (it holds resources_servers/<name>/ folders, as `gymhost write` makes), every server
    in it is served by this one process at /<name>/, with a list of them at /.
    """
    from starlette.routing import Mount

    from ._hosting._gateway import is_gym_root
    from ._hosting._loading import enter_folder, load_app
    from ._metrics import share_metrics
    from ._nemo_gym import require_nemo_gym
    from ._process._identity import process_state
    from ._serving._accepting import backlog_warning, raise_open_files_limit
    from ._serving._process_mount import apart_in_own_venvs
    from ._serving._run import bind_socket, bind_unix_socket, is_loopback, run_app, url_of
    from ._serving._workers import prepare_workers, serve_workers

    urls = _key_values("--server-url", server_urls)
    config = ServeConfig(
        host=host,
        port=port,
        server=server_name,  # type: ignore[arg-type]
        log_level=log_level,
        access_log=access_log,
        graceful_timeout=graceful_timeout,
        drain_timeout=drain_timeout,
        log_format=log_format,  # type: ignore[arg-type]
        root_path=root_path.rstrip("/"),
        backlog=backlog,
        hand_off=hand_off,
    )
    parent = os.environ.pop(PARENT_PID_ENV_VAR, None)
    if parent is not None:  # another gymhost process started this one (a gateway's process mount): die with it
        process_state.follow_parent(int(parent))
    if not token and not is_loopback(host):
        click.secho(
            f"WARNING: serving on {host} with no token: anyone who can reach this port can seed, play and verify "
            "episodes and read the pool. Set GYMHOST_TOKEN (or --token), or serve on 127.0.0.1.",
            fg="red",
            bold=True,
            err=True,
        )
    gateway = is_gym_root(folder)
    if gateway and (name or config_key or settings):
        raise click.UsageError("--name, --config-key and --set apply to one server folder, not to a Gym root")
    if advertise_url is not None and not advertise_url.startswith(("http://", "https://")):
        raise click.BadParameter(f"expected http://HOST:PORT, got {advertise_url!r}", param_hint="--advertise-url")
    try:
        if venv and not gateway and Path(folder).is_dir():
            _serve_from_own_venv(Path(folder))  # returns when this environment meets the folder's requirements
        workers_folder = prepare_workers() if workers > 1 else None  # before anything imports prometheus_client
        if venv and gateway and workers_folder is None:
            share_metrics(Path(tempfile.mkdtemp(prefix="gymhost-metrics-")))  # process mounts render with this one
        require_nemo_gym()
        overrides = _overrides(settings)
        if name is not None:
            overrides["name"] = name
        for said in raise_open_files_limit():  # before workers and instances start: they inherit it
            click.echo(f"gymhost: {said}", err=said.startswith("WARNING"))
        if (capped := backlog_warning(config.backlog)) is not None:
            click.echo(f"gymhost: {capped}")
        if uds is not None:
            sock = bind_unix_socket(uds, config.backlog)
        else:
            sock = bind_socket(config.host, config.port, config.backlog)
        try:
            served_port = sock.getsockname()[1] if uds is None else None
            process_state.configure(replica=replica_id, port=served_port, advertise_url=advertise_url)
            folder = str(enter_folder(folder))
            # click has read GYMHOST_TOKEN and GYMHOST_MASKED_VERDICTS already: no token here means none was given.
            app_settings = AppSettings.of(
                token=token or NO_TOKEN,
                max_body_bytes=max_body_bytes,
                metrics=http_metrics,
                masked_verdicts=masked_verdicts,
            )
            app = load_app(
                folder,
                app_settings,
                server_urls=urls,
                config_key=config_key,
                address=sock.getsockname()[:2] if uds is None else None,
                apart=apart_in_own_venvs(config, urls, app_settings.masked_verdicts, workers=workers) if venv else None,
                **overrides,
            )
            if config.root_path:
                MOUNT.set(app, config.root_path)  # its metrics carry the prefix it is served under
            if gateway:
                mounts = ", ".join(route.path for route in app.router.routes if isinstance(route, Mount))
                click.echo(f"gymhost: serving {Path(folder).resolve().name} at {url_of(sock)} (servers: {mounts})")
            else:
                from ._hosting._app import HOSTED

                hosted = HOSTED.get(app)
                click.echo(f"gymhost: serving {hosted.name if hosted else folder} at {url_of(sock)}")
            if workers_folder is not None:
                click.echo(f"gymhost: {workers} workers")
                serve_workers(app, sock, config, workers, workers_folder, run_app)
            else:
                run_app(app, sock, config)
        finally:
            sock.close()
    except GymhostError as error:
        raise click.ClickException(str(error)) from None


def _serve_from_own_venv(folder: Path) -> None:
    """``serve --venv`` of one folder whose requirements this environment does not meet: build (or reuse) its venv
    and run this same command there, without --venv. Returns when the requirements are met here."""
    from ._hosting._venvs import folder_venv, unmet_requirements
    from ._nemo_gym import require_nemo_gym

    require_nemo_gym()
    if not unmet_requirements(folder.resolve()):
        click.echo(f"gymhost: {folder.resolve().name}: its requirements.txt is met here; no venv of its own needed")
        return
    python = folder_venv(folder.resolve())
    arguments = [argument for argument in sys.argv[1:] if argument != "--venv"]
    os.execv(python, [str(python), "-m", "gymhost", *arguments])


@main.command()
@click.argument("source")
@click.argument("root", type=click.Path(file_okay=False, path_type=str))
@click.option("--name", default=None, help="Folder and server name (default: the bundle's folder name or the card's).")
@click.option("--split", default=None, help="Only this split's tasks (bundle), or the split name for --tasks.")
@click.option("--tasks", "tasks_file", type=click.Path(dir_okay=False, path_type=str), help="Tasks of a URL source.")
@click.option("--url", "urls", multiple=True, metavar="URL", help="Another instance of a URL source. Repeatable.")
@click.option(
    "--instances",
    cls=_InstancesOption,
    default=None,
    metavar="K|MIN:MAX",
    callback=_instances,
    help="A bundle's instances or an OpenEnv server's sessions (= episodes at once): K for a fixed pool, MIN:MAX "
    "for one that grows on demand and shrinks when idle.",
)
@click.option(
    "--mode",
    type=click.Choice(["process", "in-process"]),
    default=SourceConfig.model_fields["mode"].default,
    show_default=True,
    help="Bundle instances as processes of their own, or inside the server (for thousands of episodes at once).",
)
@click.option(
    "--prompt-field",
    default=None,
    metavar="POINTER",
    help="OpenEnv: where tasks keep their prompts, a JSON pointer into the task, then into the reset observation "
    "(default: the task's /prompt, then the observation's /metadata/prompt).",
)
@click.option(
    "--python",
    default=None,
    metavar="PATH",
    help="An agent-env bundle: the Python of a venv with agentenv-framework[openenv], which runs agent-env's OpenEnv "
    "app for it (default: $GYMHOST_AGENT_ENV_PYTHON).",
)
@click.option("--force", is_flag=True, help="Replace the folder if it exists.")
def write(
    source: str,
    root: str,
    name: str | None,
    split: str | None,
    tasks_file: str | None,
    urls: tuple[str, ...],
    instances: str | None,
    mode: str,
    prompt_field: str | None,
    python: str | None,
    force: bool,
) -> None:
    """Write ROOT/resources_servers/<name>/ for the agent environment at SOURCE.

    SOURCE is a bundle folder (gymhost's: env.py and tasks/<split>.jsonl; or agent-env's: tasks/<name>.json step
    lists, served by its OpenEnv app), the URL of a running OpenEnv server (its Task API gives the tasks), or the
    URL of a running agentenv environment (with --tasks FILE).
    """
    from .environments import write_folder

    try:
        written = write_folder(
            source,
            root,
            name=name,
            split=split,
            tasks_file=tasks_file,
            urls=urls,
            instances=instances,
            mode=mode,
            prompt_field=prompt_field,
            python=python,
            force=force,
        )
    except GymhostError as error:
        raise click.ClickException(str(error)) from None
    rows = ", ".join(f"data/{split_name}.jsonl: {count} rows" for split_name, count in written.rows.items())
    tools = ", ".join(tool["name"] for tool in written.source.tools)
    click.echo(f"gymhost: wrote {written.path} (environment {written.source.environment!r}; tools {tools}; {rows})")


@main.command()
@click.argument("folder", type=click.Path(path_type=str))
@click.option(
    "--solutions",
    "solutions_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Reference solutions for tasks that carry none: JSON Lines of {task_id, split?, tool_calls, final_text}.",
)
@click.option("--allow-unchecked", is_flag=True, help="Pass even when no row has a reference solution to check.")
def check(folder: str, solutions_file: Path | None, allow_unchecked: bool) -> None:
    """Play every row of a written FOLDER with its reference solution and with an empty attempt.

    Exits non-zero when a reference solution does not score 1.0 or an empty attempt does, and when no row has a
    reference solution at all (then nothing but the empty attempts was checked), unless --allow-unchecked.
    """
    from ._nemo_gym import require_nemo_gym

    try:
        require_nemo_gym()
        from .environments._check import check_folder, format_report, load_solutions

        checks = check_folder(folder, load_solutions(solutions_file) if solutions_file else None)
    except GymhostError as error:
        raise click.ClickException(str(error)) from None
    click.echo(format_report(checks))
    failed = [c for c in checks if c.problems]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(checks)} rows failed the check")
    checked = [c for c in checks if c.reference is not None]
    if not checked and not allow_unchecked:
        raise click.ClickException(
            f"none of the {len(checks)} rows has a reference solution: give them with --solutions FILE, or pass "
            "--allow-unchecked to accept a check of empty attempts only"
        )
    if len(checked) == len(checks):
        click.echo(f"all {len(checks)} rows pass: every reference solution scores 1.0 and no empty attempt does")
    else:
        click.echo(
            f"{len(checked)} of {len(checks)} rows checked against a reference solution, all pass; no empty attempt "
            "scores 1.0"
        )
