"""Logging: keeping a host's logging its own, how ``gymhost serve`` logs (text, or JSON lines), and warnings said
at most every few seconds however often their cause happens.

mcp's ``FastMCP`` constructor calls ``logging.basicConfig(level=INFO, handlers=[RichHandler])`` on the root logger.
In a process of its own that is harmless; in a server that builds FastMCP apps (nemo-gym 0.4.0's MCP resources
servers, in-process environment instances) it turns on an INFO line, through a rich console, for every HTTP request
any library makes, for the rest of the process. gymhost builds those apps inside this context, which makes that
one call a no-op and leaves logging as the host configured it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "JsonFormatter",
    "RateLimitedWarning",
    "error_line",
    "fastmcp_leaves_logging_alone",
    "json_line",
    "logging_config",
]


_FASTMCP_LOGGING = "mcp.server.fastmcp.utilities.logging"  # its configure_logging calls basicConfig


@contextlib.contextmanager
def fastmcp_leaves_logging_alone() -> Iterator[None]:
    """While this lasts, ``logging.basicConfig`` called from FastMCP's ``configure_logging`` does nothing; called
    from anywhere else (a Gym server's own code), it does what it always does. FastMCP itself is not imported for
    it: a Gym server that builds no FastMCP app (most do not) would pay mcp's import, a fifth of a second, at every
    start for nothing; and no import hook is needed, which would have to be safe under every importer's threads."""
    original = logging.basicConfig

    def basic_config(**kwargs: Any) -> None:
        if sys._getframe(1).f_globals.get("__name__") != _FASTMCP_LOGGING:
            original(**kwargs)

    logging.basicConfig = basic_config
    try:
        yield
    finally:
        logging.basicConfig = original


_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and every field a call passed in ``extra`` (an episode's
    end carries its session id, task id, outcome, reward or failure kind, and durations), so a run's logs can be
    searched by them. Written here rather than taken from python-json-logger: twenty lines, no dependency."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((key, value) for key, value in vars(record).items() if key not in _RECORD_FIELDS)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def json_line(logger: str, level: int, message: str) -> str:
    """A line written outside logging (what ``gymhost serve`` says as it starts, said before and after its logging
    is configured) as the record ``JsonFormatter`` makes of it: under ``--log-format json`` every line is JSON."""
    return JsonFormatter().format(logging.LogRecord(logger, level, __file__, 0, message, None, None))


def error_line(message: str, log_format: str) -> str:
    """The line a command that fails ends with: click's ``Error: ...``, or under ``--log-format json`` a record."""
    return json_line("gymhost", logging.ERROR, message) if log_format == "json" else f"Error: {message}"


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """The logging of ``gymhost serve``, as a ``logging.config.dictConfig`` dict both ASGI servers take: the server's
    own loggers and gymhost's (``gymhost``, ``gymhost.environments``, ``gymhost.episodes``) on stderr, access lines on
    stdout, as text (uvicorn's look) or as JSON lines."""
    if log_format == "json":
        formatters: dict[str, Any] = {
            "default": {"()": "gymhost._logging.JsonFormatter"},
            "gymhost": {"()": "gymhost._logging.JsonFormatter"},
            "access": {"()": "gymhost._logging.JsonFormatter"},
        }
    else:
        formatters = {
            "default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(levelprefix)s %(message)s"},
            "gymhost": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(levelprefix)s %(name)s: %(message)s"},
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            },
        }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": formatters,
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"},
            "gymhost": {"class": "logging.StreamHandler", "formatter": "gymhost", "stream": "ext://sys.stderr"},
            "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stdout"},
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
            "hypercorn.error": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "hypercorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
            "gymhost": {"handlers": ["gymhost"], "level": level.upper(), "propagate": False},
        },
    }


class RateLimitedWarning:
    """A warning said at most once every ``every_s``, with how many times it happened meanwhile: a fault that
    recurs under load is said, without one line per connection."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self._logger = logger
        self._every_s = every_s
        self._last = 0.0
        self._since = 0

    def __call__(self, message: str, *args: Any) -> None:
        self._since += 1
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._logger.warning(message + " (%d time(s) since the last warning)", *args, self._since)
            self._last, self._since = now, 0
