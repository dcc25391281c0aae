"""``gymhost serve``: its options, turned into a ``ServeConfig`` that ``gymhost.Server`` runs."""

from __future__ import annotations

import os
from typing import Any

import click
from click.core import ParameterSource

from .._config import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DRAIN_TIMEOUT_ENV_VAR,
    FOLDER_ENV_VAR,
    FOLDERS_SPLIT_NOTE,
    INSTANCE_LIMIT_ENV_VARS,
    MASKED_VERDICTS,
    MASKED_VERDICTS_ENV_VAR,
    NETWORK_ENV_VAR,
    NO_TOKEN,
    REPLICA_ENV_VAR,
    SANDBOX_ENV_VAR,
    SANDBOXES,
    SERVERS,
    TOKEN_ENV_VAR,
    AppSettings,
    ServeConfig,
    configured_instance_limits,
    take_secrets,
)
from .._exceptions import FolderError
from .._serving._server import Server
from ._common import key_values, one_line_errors, overrides

__all__ = ["serve"]


@click.command()
@click.argument("paths", nargs=-1, required=True, metavar="FOLDER_OR_NAME...", envvar=FOLDER_ENV_VAR)
@click.option(
    "--only",
    default=None,
    metavar="NAME,NAME",
    help="With a Gym root: serve only these of its servers.",
)
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
    "--no-token",
    is_flag=True,
    help="Serve beyond loopback without a token, on purpose: something in front (a network policy, a private network, "
    "a gateway that authenticates) keeps everyone else out. Without a token or this, gymhost serve refuses to listen "
    "beyond loopback.",
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
    envvar=DRAIN_TIMEOUT_ENV_VAR,
    show_envvar=True,
    default=DEFAULT_DRAIN_TIMEOUT,
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
    "--fd",
    default=None,
    type=click.IntRange(0),
    help="Serve the listening socket this process inherited as file descriptor FD (a supervisor's, as systemd's "
    "socket activation) instead of binding one.",
)
@click.option(
    "--backlog",
    default=ServeConfig.backlog,
    show_default=True,
    type=click.IntRange(1),
    help="Connections queued before they are accepted (a burst of connects; the kernel caps it at net.core.somaxconn).",
)
@click.option(
    "--sandbox",
    envvar=SANDBOX_ENV_VAR,
    show_envvar=True,
    type=click.Choice(SANDBOXES),
    default=None,
    help="How hosted code runs. auto (a folder's default): a written bundle's process instances confined in "
    "namespaces where this machine allows them, else with Landlock and seccomp, else within their limits, said at "
    "start; strict: confined or no start, and a Gym server's own process confined too; off: unconfined, the code "
    "trusted. Over what a written folder's config says.  [default: the folder's, else auto]",
)
@click.option(
    "--network",
    envvar=NETWORK_ENV_VAR,
    show_envvar=True,
    is_flag=True,
    default=None,
    help="Confined hosted code may reach the network (a written bundle's instances; a Gym server under --sandbox "
    "strict). [default: the folder's: a written config's source.network, a Gym server that calls other servers]",
)
@click.option(
    "--instance-memory",
    envvar=INSTANCE_LIMIT_ENV_VARS["instance_memory"],
    show_envvar=True,
    metavar="SIZE",
    default=None,
    help="A confined instance's memory (as 1GiB); past it, the instance is stopped and its episode masked.  "
    "[default: the folder's, else 2GiB]",
)
@click.option(
    "--instance-pids",
    envvar=INSTANCE_LIMIT_ENV_VARS["instance_pids"],
    show_envvar=True,
    metavar="N",
    type=click.IntRange(1),
    default=None,
    help="A confined instance's processes and threads.  [default: the folder's, else 512]",
)
@click.option(
    "--instance-cpu",
    envvar=INSTANCE_LIMIT_ENV_VARS["instance_cpu_s"],
    show_envvar=True,
    metavar="SECONDS",
    type=click.IntRange(1),
    default=None,
    help="A confined instance's CPU time (an episode's: instances are fresh for each).  [default: the folder's, "
    "else 600]",
)
@click.option(
    "--root-path",
    default=ServeConfig.root_path,
    metavar="PREFIX",
    help="The path prefix a proxy in front serves this server under (its cookies and MCP paths are the prefix's).",
)
def serve(paths: tuple[str, ...], only: str | None, **options: Any) -> None:
    """Serve Gym resources servers: a folder, a Gym root, or installed Gym servers by name.

    \b
    gymhost serve example_single_tool_call          an installed Gym server, by name (gymhost list)
    gymhost serve path/to/folder                     a folder (Gym's, or one gymhost write made)
    gymhost serve ROOT                               every server of a Gym root, each at /<name>
    gymhost serve ROOT --only a,b                    some of them
    gymhost serve NAME_OR_FOLDER NAME_OR_FOLDER ...  several, each at /<name>

    With no argument, the folders or names in GYMHOST_FOLDER (separated by spaces), as the container image runs.
    """
    take_secrets()  # click has read GYMHOST_TOKEN: from here on, no code this process hosts finds it
    sandbox = options.pop("sandbox")
    if sandbox is not None:  # read where each folder's launcher starts, in this process, its workers or its venv
        os.environ[SANDBOX_ENV_VAR] = sandbox
    if options.pop("network"):  # the same way
        os.environ[NETWORK_ENV_VAR] = "1"
    for option, field in (("instance_memory", "instance_memory"), ("instance_pids", "instance_pids"),
                          ("instance_cpu", "instance_cpu_s")):  # fmt: skip
        value = options.pop(option)
        if value is not None:  # the same way, checked there (``configured_instance_limits``)
            os.environ[INSTANCE_LIMIT_ENV_VARS[field]] = str(value)
    source = click.get_current_context().get_parameter_source("paths")
    with one_line_errors(options["log_format"]):
        configured_instance_limits()  # a size that is not one: said now, not as the first instance starts
        config = _config(paths, only, **options)
        try:
            Server(config, say=_say).run()
        except FolderError as error:
            if source is not ParameterSource.ENVIRONMENT or len(paths) < 2:
                raise
            raise FolderError(f"{error} ({FOLDERS_SPLIT_NOTE})") from None


def _config(
    paths: tuple[str, ...],
    only: str | None,
    *,
    server_urls: tuple[str, ...],
    settings: tuple[str, ...],
    token: str | None,
    no_token: bool,
    max_body_bytes: int,
    http_metrics: bool,
    masked_verdicts: str,
    server_name: str,
    root_path: str,
    **rest: Any,
) -> ServeConfig:
    if token and no_token:
        raise click.UsageError("--no-token and a token (--token or GYMHOST_TOKEN) say opposite things: give one")
    app = AppSettings.of(
        # click has read GYMHOST_TOKEN and GYMHOST_MASKED_VERDICTS already: no token here means none was given.
        token=token or NO_TOKEN,
        max_body_bytes=max_body_bytes,
        metrics=http_metrics,
        masked_verdicts=masked_verdicts,
    )
    if rest["advertise_url"] is not None and not rest["advertise_url"].startswith(("http://", "https://")):
        raise click.BadParameter(
            f"expected http://HOST:PORT, got {rest['advertise_url']!r}", param_hint="--advertise-url"
        )
    return ServeConfig(
        paths=paths,
        only=tuple(name for name in (only or "").split(",") if name),
        server_urls=key_values("--server-url", server_urls),
        overrides=overrides(settings),
        app=app,
        no_token=no_token,
        server=server_name,  # type: ignore[arg-type]
        root_path=root_path.rstrip("/"),
        **rest,
    )


def _say(line: str) -> None:
    if line.startswith("WARNING"):
        click.secho(f"gymhost: {line}", fg="red", bold=True, err=True)
    else:
        click.echo(f"gymhost: {line}")
