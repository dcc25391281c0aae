"""Workers of another ASGI server's making (`uvicorn asgi:app --workers N`, hypercorn's, gunicorn's): refused.

Each worker holds the episodes it seeded. `gymhost serve --workers N` sends every request to the worker that holds
its episode; uvicorn's, hypercorn's and gunicorn's workers share one listening socket with no such routing, so a
trainer that opens a connection per call (verifiers does) reaches the wrong worker about half the time, and the
episode is lost (410). Rather than start and lose episodes, the app refuses to load in such a worker, naming the way
that works.

The worker count is read as the server itself reads it, from its command line (a spawned or forked worker keeps its
supervisor's ``sys.argv``) and its environment. Where it cannot be known (a gunicorn or hypercorn config file that
may set it), the app refuses too, and says how to make it known.
"""

from __future__ import annotations

import os
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["STARTUP_FAILURE", "foreign_workers", "refuse_foreign_workers"]

# The exit status all three servers read as "this worker can never start": uvicorn (STARTUP_FAILURE) and gunicorn
# (WORKER_BOOT_ERROR) then stop their supervisor instead of starting the worker again; hypercorn stops on any.
STARTUP_FAILURE = 3

_SERVERS = ("uvicorn", "hypercorn", "gunicorn")
_WORKERS_FLAGS = {"uvicorn": ("--workers",), "hypercorn": ("-w", "--workers"), "gunicorn": ("-w", "--workers")}
_CONFIG_FLAGS = {"uvicorn": (), "hypercorn": ("-c", "--config"), "gunicorn": ("-c", "--config")}


def foreign_workers(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why this process must not serve, when it is one of several workers another ASGI server started; else None."""
    server = _server(argv)
    if server is None:
        return None
    arguments = list(argv[1:])
    if server == "gunicorn":  # gunicorn reads GUNICORN_CMD_ARGS before its command line
        arguments = shlex.split(environ.get("GUNICORN_CMD_ARGS", "")) + arguments
    if server == "uvicorn" and ("--reload" in arguments or _truthy(environ.get("UVICORN_RELOAD"))):
        return None  # uvicorn reloads one process and ignores its worker count
    count = _flag(arguments, _WORKERS_FLAGS[server])
    if count is None and server == "uvicorn":
        count = environ.get("UVICORN_WORKERS") or None  # its options read UVICORN_<OPTION> (empty: unset)
    if count is None:
        config = _flag(arguments, _CONFIG_FLAGS[server])
        if server == "gunicorn" and config is None and Path("gunicorn.conf.py").is_file():
            config = "gunicorn.conf.py"  # gunicorn reads it from the working directory unless told otherwise
        if config is not None:
            count = _from_config(config) if server == "hypercorn" else None
            if count is None:
                return (
                    f"{server} was given a config file ({config}) that may start several workers, which would lose "
                    f"episodes (each holds its own); give {server} --workers 1, or serve with gymhost serve "
                    "--workers N, which sends every request to the worker that holds its episode"
                )
    if count is None and server in ("uvicorn", "gunicorn"):
        count = environ.get("WEB_CONCURRENCY")  # both read it as their default worker count
    workers = _number(count) if count is not None else 1
    if workers is None:
        return f"{server}'s worker count {count!r} is not a number"
    if workers <= 1:
        return None
    return (
        f"{server} runs {workers} workers of this app, and its workers share one socket with no regard for which "
        f"holds an episode: a trainer's calls would reach the wrong one and lose their episodes. Serve with gymhost "
        f"serve --workers {workers} (each request reaches the worker that holds its episode), or run {server} with "
        "one worker"
    )


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "t", "yes", "y", "on")  # click's spellings


def _server(argv: Sequence[str]) -> str | None:
    """``uvicorn ...``, ``python -m uvicorn ...`` (argv[0] is then its ``__main__.py``), likewise the others."""
    if not argv:
        return None
    program = Path(argv[0])
    name = program.parent.name if program.name == "__main__.py" else program.name
    return name if name in _SERVERS else None


def _flag(arguments: Sequence[str], names: Sequence[str]) -> str | None:
    """The last value given to any of ``names`` (``--workers 2``, ``--workers=2``, ``-w 2``, ``-w2``)."""
    found = None
    for index, argument in enumerate(arguments):
        for name in names:
            if argument == name and index + 1 < len(arguments):
                found = arguments[index + 1]
            elif argument.startswith(name + "="):
                found = argument.partition("=")[2]
            elif len(name) == 2 and argument.startswith(name) and len(argument) > 2 and argument[2] != "-":
                found = argument[2:]
    return found


def _from_config(config: str) -> str | None:
    """hypercorn's TOML config's ``workers`` (1 when it sets none); None for a Python config, which cannot be read."""
    path = Path(config.removeprefix("file:"))
    if config.startswith("python:") or path.suffix != ".toml" or not path.is_file():
        return None
    try:
        return str(tomllib.loads(path.read_text()).get("workers", 1))
    except (OSError, tomllib.TOMLDecodeError):
        return None


def _number(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def refuse_foreign_workers() -> None:
    """In a worker another ASGI server started with others: say why on stderr, and exit as a worker that can never
    start, which stops that server."""
    reason = foreign_workers(sys.argv, os.environ)
    if reason is not None:
        print(f"gymhost: {reason}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE)
