"""Every default of the core, written once, and the two settings objects that carry them down.

Like httpx's ``_config.py`` and uvicorn's ``Config``: the values live here, the command line shows them as its
defaults, and the modules below receive one settings object instead of keeping defaults of their own: ``AppSettings``
for what an app guards and measures (``create_app``, ``create_gateway``, the middleware stack), ``ServeConfig`` for
how ``gymhost serve`` runs it. The environments' settings have their own home, ``gymhost.environments._settings``.

The ``GYMHOST_*`` environment variables are read here and nowhere else (one function each, below the names), so what
the environment can change is one list. ``gymhost serve``'s options name some of them as their environment variables
(click reads those, and ``--help`` shows them); a ``ServeConfig`` made in Python reads the same ones here. The one
exception is agent-env's app script, which runs in agent-env's venv and imports nothing of gymhost
(``environments/_openenv/_agent_env_app.py``). The secret ones (``SECRET_SETTINGS``) are taken out of the
environment as they are read (``take_secrets``): no code gymhost hosts, and no child it starts, finds them there.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from ._exceptions import ServeError

__all__ = [
    "AGENT_ENV_PYTHON_ENV_VAR",
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_HOST",
    "DEFAULT_INSTANCE_CPU_S",
    "DEFAULT_INSTANCE_MEMORY",
    "DEFAULT_INSTANCE_PIDS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_JSON_DEPTH",
    "DEFAULT_SANDBOX",
    "DRAIN_TIMEOUT_ENV_VAR",
    "FOLDERS_SPLIT_NOTE",
    "FOLDER_ENV_VAR",
    "INSTANCE_LIMIT_ENV_VARS",
    "MASKED_VERDICTS",
    "MASKED_VERDICTS_ENV_VAR",
    "NETWORK_ENV_VAR",
    "NO_TOKEN",
    "PARENT_PID_ENV_VAR",
    "REPLICA_ENV_VAR",
    "SANDBOXES",
    "SANDBOX_ENV_VAR",
    "SECRET_ENV_VAR",
    "SECRET_SETTINGS",
    "SERVERS",
    "STARTUP_PATH",
    "TOKEN_ENV_VAR",
    "VENV_DIR_ENV_VAR",
    "AppSettings",
    "MaskedVerdicts",
    "NoToken",
    "Sandbox",
    "ServeConfig",
    "ServerName",
    "configured_agent_env_python",
    "configured_drain_timeout",
    "configured_folders",
    "configured_instance_limits",
    "configured_network",
    "configured_replica_id",
    "configured_sandbox",
    "configured_secret",
    "hand_secrets",
    "resolve_masked_verdicts",
    "resolve_token",
    "secret_file",
    "secret_settings",
    "take_parent_pid",
    "take_secrets",
    "venv_root",
]

# Python's module path as this process began (less its working directory, which ``python -m`` puts first), before
# gymhost put any served folder on it (``_hosting._entrypoint``): what confined hosted code may read of the
# server's interpreter (``_confinement``), and never a folder's tasks.
STARTUP_PATH: Final = tuple(entry for entry in sys.path if entry and entry != os.getcwd())

DEFAULT_HOST: Final = "127.0.0.1"  # loopback: listening beyond it is a choice, made with a token
DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024  # a long multi-turn transcript with images, bounded per request
DEFAULT_MAX_JSON_DEPTH: Final = 128  # tool schemas and transcripts nest tens deep; Python's recursion breaks near 1,000

TOKEN_ENV_VAR: Final = "GYMHOST_TOKEN"
REPLICA_ENV_VAR: Final = "GYMHOST_REPLICA_ID"
SECRET_ENV_VAR: Final = "GYMHOST_SECRET"
FOLDER_ENV_VAR: Final = "GYMHOST_FOLDER"
# Added to a failure to serve what GYMHOST_FOLDER named, when it named several: perhaps one path with spaces.
FOLDERS_SPLIT_NOTE: Final = f"{FOLDER_ENV_VAR} is split on spaces: a path with a space in it cannot be given there"
PARENT_PID_ENV_VAR: Final = "GYMHOST_PARENT_PID"  # a gymhost process another one started dies with it
MASKED_VERDICTS_ENV_VAR: Final = "GYMHOST_MASKED_VERDICTS"
DRAIN_TIMEOUT_ENV_VAR: Final = "GYMHOST_DRAIN_TIMEOUT"
SANDBOX_ENV_VAR: Final = "GYMHOST_SANDBOX"
# How hosted code runs (``gymhost._confinement``): ``auto`` the strongest confinement this machine allows, ``strict``
# namespaces or no start, ``off`` none (the code is trusted).
NETWORK_ENV_VAR: Final = "GYMHOST_NETWORK"  # ``gymhost serve --network``: confined hosted code may reach the network
Sandbox = Literal["auto", "strict", "off"]
SANDBOXES: Final[tuple[Sandbox, ...]] = ("auto", "strict", "off")
DEFAULT_SANDBOX: Final[Sandbox] = "auto"
# What each confined process instance may take (``_confinement._limits``); ``gymhost serve --instance-memory``,
# ``--instance-pids`` and ``--instance-cpu`` set them over a written config's (``configured_instance_limits``).
# Memory: room for an environment that loads a model or a dataset beside the template's pages it shares (counted);
# processes, threads included: a compiler's or a test runner's, and a thread pool per core of a big machine;
# CPU: an episode's worth of compiling and running tests, past which a spinning instance is stopped.
DEFAULT_INSTANCE_MEMORY: Final = 2 * 1024**3
DEFAULT_INSTANCE_PIDS: Final = 512
DEFAULT_INSTANCE_CPU_S: Final = 600
INSTANCE_LIMIT_ENV_VARS: Final = {
    "instance_memory": "GYMHOST_INSTANCE_MEMORY",
    "instance_pids": "GYMHOST_INSTANCE_PIDS",
    "instance_cpu_s": "GYMHOST_INSTANCE_CPU",
}
DEFAULT_DRAIN_TIMEOUT: Final = 120  # seconds; ServeConfig.drain_timeout says why
VENV_DIR_ENV_VAR: Final = "GYMHOST_VENV_DIR"  # where folders' own venvs are kept (default ~/.cache/gymhost/venvs)
AGENT_ENV_PYTHON_ENV_VAR: Final = "GYMHOST_AGENT_ENV_PYTHON"  # the interpreter with agentenv-framework[openenv]
# Whoever reads one of these can sign any episode's cookie or pass the bearer check: read once, then gone.
SECRET_SETTINGS: Final = (SECRET_ENV_VAR, TOKEN_ENV_VAR)

_taken: dict[str, str] = {}  # the secret settings taken out of the environment (an empty one: unset)


def take_secrets() -> None:
    """Take the secret settings out of the process environment, before any server or environment code is imported
    and before any child starts: the code gymhost hosts runs the model's text in subprocesses that inherit
    ``os.environ`` (Gym's ``code_gen`` does). Every gymhost entry point calls it first (``gymhost serve``,
    ``create_app``, ``create_gateway``, ``asgi:app``); reading a secret setting calls it too, so a value set later,
    in Python, is taken the same way."""
    for name in SECRET_SETTINGS:
        _take(name)


def _take(name: str) -> str | None:
    if name in os.environ:
        value = os.environ[name]
        _erase_from_environment(name)
        if value:
            _taken[name] = value
        else:
            _taken.pop(name, None)
    return _taken.get(name)


def _erase_from_environment(name: str) -> None:
    """``name`` gone from ``os.environ`` and from this process's own environment block: ``/proc/PID/environ`` shows
    the block as it was at ``exec`` to every process of this user, and ``unsetenv`` leaves it so; the value's bytes
    are overwritten where the C library keeps them."""
    with contextlib.suppress(OSError, AttributeError):  # no C library to ask: os.environ at least
        getenv = ctypes.CDLL(None).getenv
        getenv.restype, getenv.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        address = getenv(os.fsencode(name))
        if address:
            ctypes.memset(address, 0, len(ctypes.string_at(address)))
    os.environ.pop(name, None)


def secret_settings() -> dict[str, str]:
    """The secret settings taken, as the environment of a gymhost process this one starts to serve in its place or
    beside it (itself again from a folder's venv; a gateway's process mount), which takes them at its own start."""
    take_secrets()
    return dict(_taken)


def hand_secrets(values: Mapping[str, str]) -> None:
    """Secret settings given to this process otherwise than in its environment (a pipe from the process that started
    it: ``_serving._confined``, whose sandbox's first process would show an environment to the code it hosts),
    kept as if taken from it."""
    for name in SECRET_SETTINGS:
        if values.get(name):
            _taken[name] = values[name]


def configured_secret() -> str | None:
    """``GYMHOST_SECRET``: what sessions and MCP tokens are signed with (None: unset or empty)."""
    return _take(SECRET_ENV_VAR)


def secret_file() -> Path | None:
    """Where the secret gymhost makes when ``GYMHOST_SECRET`` is unset is kept, for this server's next start on this
    machine to find: the user's state directory (``$XDG_STATE_HOME``, else ``~/.local/state``); None for a user with
    no home (a container's user with no ``HOME`` and no entry in ``/etc/passwd``)."""
    state = os.environ.get("XDG_STATE_HOME")
    if not state:
        try:
            state = str(Path.home() / ".local" / "state")
        except (RuntimeError, KeyError):
            return None
    return Path(state) / "gymhost" / "secret"


def configured_replica_id() -> str | None:
    """``GYMHOST_REPLICA_ID``: this replica's name in the sessions it signs."""
    return os.environ.get(REPLICA_ENV_VAR) or None


def configured_drain_timeout() -> int:
    """``GYMHOST_DRAIN_TIMEOUT``, the drain's limit in seconds, when set; else ``DEFAULT_DRAIN_TIMEOUT``."""
    value = os.environ.get(DRAIN_TIMEOUT_ENV_VAR, "").strip()
    if not value:
        return DEFAULT_DRAIN_TIMEOUT
    seconds = int(value) if value.isdigit() else None
    if seconds is None:
        raise ServeError(f"{DRAIN_TIMEOUT_ENV_VAR} is {value!r}; expected a whole number of seconds, 0 or more")
    return seconds


def configured_sandbox() -> Sandbox | None:
    """``GYMHOST_SANDBOX`` (``gymhost serve --sandbox``), when set: the operator's choice, over a written config's."""
    value = os.environ.get(SANDBOX_ENV_VAR, "").strip()
    if not value:
        return None
    for sandbox in SANDBOXES:
        if value == sandbox:
            return sandbox
    raise ServeError(f"{SANDBOX_ENV_VAR} is {value!r}; expected one of: {', '.join(SANDBOXES)}")


def configured_network() -> bool:
    """``GYMHOST_NETWORK`` (``gymhost serve --network``): the operator lets confined hosted code reach the network,
    over what a folder says (a written config's ``source.network``; a Gym server that calls no other server)."""
    value = os.environ.get(NETWORK_ENV_VAR, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ServeError(f"{NETWORK_ENV_VAR} is {value!r}; expected 1 or 0")


def configured_instance_limits() -> dict[str, int]:
    """``GYMHOST_INSTANCE_MEMORY`` (bytes, or a size as 512MiB or 2GiB), ``GYMHOST_INSTANCE_PIDS`` and
    ``GYMHOST_INSTANCE_CPU`` (seconds), those set: the operator's limits, by a bundle source's field names."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    limits = {}
    for name, variable in INSTANCE_LIMIT_ENV_VARS.items():
        value = os.environ.get(variable, "").strip()
        if not value:
            continue
        try:
            number = int(TypeAdapter(ByteSize).validate_python(value)) if name == "instance_memory" else int(value)
        except (ValueError, ValidationError):
            number = 0
        if number < 1:
            expected = "a size, as 512MiB or 2GiB" if name == "instance_memory" else "a whole number, 1 or more"
            raise ServeError(f"{variable} is {value!r}; expected {expected}")
        limits[name] = number
    return limits


def configured_folders() -> tuple[str, ...]:
    """``GYMHOST_FOLDER``: what ``asgi:app`` serves, and ``gymhost serve`` given nothing to serve (none when unset):
    folders, Gym roots or installed servers' names, separated by spaces, as click splits it for ``gymhost serve``."""
    return tuple(os.environ.get(FOLDER_ENV_VAR, "").split())


def take_parent_pid() -> int | None:
    """``GYMHOST_PARENT_PID``, removed from the environment once read: the gymhost process that started this one (a
    gateway's process mount), which this one dies with; its own children are not that parent's."""
    parent = os.environ.pop(PARENT_PID_ENV_VAR, None)
    return int(parent) if parent else None


def venv_root() -> Path:
    """Where folders' own venvs are kept: ``GYMHOST_VENV_DIR``, else ``~/.cache/gymhost/venvs``."""
    return Path(os.environ.get(VENV_DIR_ENV_VAR) or Path.home() / ".cache" / "gymhost" / "venvs")


def configured_agent_env_python() -> str | None:
    """``GYMHOST_AGENT_ENV_PYTHON``: the interpreter that runs agent-env's app, when the command line names none."""
    return os.environ.get(AGENT_ENV_PYTHON_ENV_VAR) or None


# How a masked verdict (``mask_sample: true``: the infrastructure or the environment lost the episode) reaches the
# client (``middleware.masked_verdicts``). ``refuse``: an HTTP error naming the failure, which every client fails the
# rollout on (verifiers never reads ``mask_sample`` and would train on the 0.0 of a 200). ``answer``: a 200 with
# ``mask_sample``, for clients that read it (Gym 0.5+'s rollout collection, which aborts on an error instead).
MaskedVerdicts = Literal["refuse", "answer"]
MASKED_VERDICTS: Final[tuple[MaskedVerdicts, ...]] = ("refuse", "answer")

ServerName = Literal["uvicorn", "hypercorn"]
SERVERS: Final[tuple[ServerName, ...]] = ("uvicorn", "hypercorn")


class NoToken(enum.Enum):
    """The bearer-token check turned off on purpose: ``token=NO_TOKEN``. ``None`` means "read GYMHOST_TOKEN"."""

    NO_TOKEN = "no token"


NO_TOKEN: Final = NoToken.NO_TOKEN


def resolve_token(token: str | NoToken | None) -> str | None:
    """The token every request must carry, or None for no check.

    ``None`` reads ``GYMHOST_TOKEN`` (unset or empty: no check); ``NO_TOKEN`` turns the check off; a string is the
    token. A header carries ASCII only, so a token that is not ASCII could never be sent: it is refused here, at
    build time (without echoing it), and so is an empty string, which would say neither "off" nor a token.
    """
    if isinstance(token, NoToken):
        return None
    if token == "":
        raise ServeError("the bearer token is empty; pass NO_TOKEN to turn the check off")
    resolved = token if token is not None else _take(TOKEN_ENV_VAR)
    if resolved is not None and not (resolved.isascii() and resolved.isprintable() and " " not in resolved):
        raise ServeError("the bearer token must be printable ASCII without spaces (it travels in an HTTP header)")
    return resolved


def resolve_masked_verdicts(value: str | None, default: MaskedVerdicts = "refuse") -> MaskedVerdicts:
    """``value``, or ``GYMHOST_MASKED_VERDICTS`` when None, or ``default`` when that is unset too; anything else
    than ``MASKED_VERDICTS`` is refused, naming them."""
    resolved = value if value is not None else (os.environ.get(MASKED_VERDICTS_ENV_VAR) or default)
    for mode in MASKED_VERDICTS:
        if resolved == mode:
            return mode
    where = "masked_verdicts" if value is not None else MASKED_VERDICTS_ENV_VAR
    raise ServeError(f"{where} is {resolved!r}; expected one of: {', '.join(MASKED_VERDICTS)}")


@dataclass(frozen=True)
class AppSettings:
    """What an app refuses and measures, decided once where it is built and passed down to its middleware stack.

    ``token``: the bearer token every request but a liveness probe must carry (already resolved: None is no check).
    Bodies above ``max_body_bytes`` are refused 413; JSON nested deeper than ``max_json_depth``, or holding a lone
    surrogate escape, 400. ``http_metrics`` False leaves out the per-request HTTP metrics. ``masked_verdicts``: how
    a masked verdict reaches the client (``MaskedVerdicts``).
    """

    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    http_metrics: bool = True
    masked_verdicts: MaskedVerdicts = "refuse"

    @classmethod
    def of(
        cls,
        *,
        token: str | NoToken | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        metrics: bool = True,
        masked_verdicts: str | None = None,
    ) -> AppSettings:
        """From ``create_app``'s keyword arguments, the token and the masked verdicts' mode resolved (``None`` reads
        their environment variables)."""
        return cls(
            resolve_token(token), max_body_bytes, max_json_depth, metrics, resolve_masked_verdicts(masked_verdicts)
        )


@dataclass(frozen=True)
class ServeConfig:
    """What ``gymhost serve`` serves and how: every option of the command a field (but the confinement's, which every
    process of the server reads from the environment: ``SANDBOX_ENV_VAR``, ``NETWORK_ENV_VAR``,
    ``INSTANCE_LIMIT_ENV_VARS``), kept apart from running it (``gymhost.Server``), as uvicorn keeps ``Config`` from
    ``Server``."""

    # What to serve (``_hosting._targets``): folders, a Gym root, or installed Gym servers by name; ``only`` picks
    # servers of a root.
    paths: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    # One server's config: its runtime name, the top-level key of its configs, fields set over the config's values.
    name: str | None = None
    config_key: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    # Where the other Gym servers it calls by name (a judge, a policy model) listen.
    server_urls: Mapping[str, str] = field(default_factory=dict)
    # What its apps refuse and measure: by default, as the environment says (GYMHOST_TOKEN, GYMHOST_MASKED_VERDICTS),
    # read when the config is made, as the command line reads them.
    app: AppSettings = field(default_factory=AppSettings.of)
    # Beyond loopback, a server with no token is refused unless this says something in front guards the port.
    no_token: bool = False
    # A folder whose requirements.txt this environment does not meet is served from a venv of its own.
    venv: bool = False
    workers: int = 1
    # This replica's name in the sessions it signs (default host:port), and where other replicas reach it.
    replica_id: str | None = None
    advertise_url: str | None = None
    uds: str | None = None  # a Unix socket to listen on instead of host:port
    # A listening socket this process inherited, by its file descriptor, instead of host:port or uds: a supervisor's
    # (systemd's; gymhost's own, outside a confined server's sandbox).
    fd: int | None = None
    host: str = DEFAULT_HOST
    port: int = 8000
    server: ServerName = "uvicorn"
    log_level: str = "info"
    # Off by default, as under Gym's launcher: a line per tool call costs more than the call at high load.
    access_log: bool = False
    # Longer than a trainer's client keep-alive, as Gym's launcher sets it, so the server never closes a connection
    # the client is about to reuse.
    timeout_keep_alive: int = 30
    # On SIGTERM or SIGINT, requests in flight get this long to finish; then they are cancelled and the app's
    # lifespan shuts down (a written agent environment ends its open episodes and stops its instances).
    graceful_timeout: int = 30
    # On SIGTERM or SIGINT the process first drains: no new episodes, open ones go on until they end or this passes.
    # Long enough for an episode with a model thinking between tool calls to finish; a Kubernetes pod needs
    # terminationGracePeriodSeconds above drain_timeout + graceful_timeout (deploy/ uses 160).
    drain_timeout: int = field(default_factory=configured_drain_timeout)
    log_format: Literal["text", "json"] = "text"
    # The path prefix a proxy in front serves the app under (a gateway's process mount): uvicorn's root_path.
    root_path: str = ""
    # Connections the listening socket queues before they are accepted: a burst of the 16k concurrent requests Gym
    # states, each on a connection of its own as verifiers opens them, is a burst of connects. The kernel caps it at
    # net.core.somaxconn (4096 on most Linux hosts; raise it with sysctl).
    backlog: int = 16384
    # With --workers, a connection landing on a worker that does not own its session is handed to the owner (the
    # connection itself, ``_serving._handoff``); off, its requests are forwarded through the worker that accepted it.
    hand_off: bool = True
