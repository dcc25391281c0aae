"""The environments' errors, in one place (the whole tree is drawn in ``gymhost._exceptions``).

Every class derives from ``gymhost.GymhostError``. The ones a user can meet (writing a folder, checking it,
starting its server) are exported from ``gymhost.environments``; the others are how the modules below tell each other
what went wrong, and never leave the server: they become a masked verdict or an HTTP answer.
"""

from __future__ import annotations

from .._exceptions import GymhostError

__all__ = [
    "CatalogError",
    "CheckError",
    "DataPlaneError",
    "EnvAtCapacityError",
    "EnvDroppedError",
    "EnvFailedError",
    "EnvTimeoutError",
    "EnvUnavailableError",
    "EpisodeStateError",
    "ExtensionError",
    "InstanceLimitError",
    "MalformedReplyError",
    "McpMalformedReplyError",
    "McpSessionError",
    "PoolExhaustedError",
    "SessionConflictError",
    "SourceError",
    "StartupError",
    "TaskError",
    "UnknownTaskError",
    "WriteError",
]

# -- writing and checking a folder -------------------------------------------------------------------------------


class TaskError(GymhostError):
    """A task file that is not valid; the message names file, line and field."""


class SourceError(GymhostError):
    """The SOURCE of ``gymhost write`` is not a usable bundle or environment URL."""


class CatalogError(GymhostError):
    """The environment's tools or extensions cannot back a Gym server, or a task uses what the card lacks."""


class WriteError(GymhostError):
    """The folder cannot be written: a bad name, or a folder already there without ``--force``."""


class CheckError(GymhostError):
    """The folder is not one ``gymhost write`` produced, or has no rows."""


# -- the pool of instances ---------------------------------------------------------------------------------------


class StartupError(GymhostError):
    """The pool could not bring its instances up, or they disagree about what environment they are."""


class PoolExhaustedError(GymhostError):
    """No instance became free within the lease timeout."""


# -- one instance on the wire (``_agentenv._client``, ``_openenv._client``) ------------------------------------------


class EnvUnavailableError(GymhostError):
    """The instance did not answer: connection refused or dropped, or too slow."""


class EnvTimeoutError(EnvUnavailableError):
    """The instance took longer than the timeout to answer."""


class EnvDroppedError(EnvUnavailableError):
    """The instance dropped the connection in the middle of a call: it crashed, or was killed."""


class InstanceLimitError(EnvDroppedError):
    """The instance reached one of its limits (memory, processes, CPU time, a file's size: ``_confinement._limits``)
    and stopped, saying which. ``kind`` is the limit's failure_kind."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class EnvAtCapacityError(EnvUnavailableError):
    """The environment server refused another session (OpenEnv's ``CAPACITY_REACHED``) for longer than the limit."""


class DataPlaneError(GymhostError):
    """The instance answered a data-plane call (or the card) with an error."""


class EnvFailedError(DataPlaneError):
    """The environment ended the episode with a failure of its own: an OpenEnv observation whose ``metadata.status``
    is ``"error"`` (agent-env's deploy, run or reward failed), or an episode it ended without any reward. ``kind``
    names it (``_outcomes``); none is the environment's error."""

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class MalformedReplyError(DataPlaneError):
    """The instance answered, but not in the protocol: not JSON, not JSON-RPC, an HTTP error. Unlike an error the
    protocol carries (a seed the environment refused), this says the instance itself is broken."""


class ExtensionError(GymhostError):
    """A card extension could not be called, or answered an error."""


class McpSessionError(GymhostError):
    """An MCP-level failure: a JSON-RPC error, an HTTP error, an unreadable reply, or a session the server lost.
    A tool that fails is not one: its result says ``isError``."""


class McpMalformedReplyError(McpSessionError, MalformedReplyError):
    """An MCP reply that is not MCP: unreadable, not JSON-RPC, or an HTTP error other than a lost session."""


# -- episodes (``_episodes``) -------------------------------------------------------------------------------------


class UnknownTaskError(GymhostError, LookupError):
    """The row names a task this server does not have."""


class SessionConflictError(GymhostError):
    """The session is already seeded with another task or episode, or was closed."""


class EpisodeStateError(GymhostError):
    """A call the session's episode is not in a state for: verify without a seed, after a close, or a second time
    (then ``verdict`` is the first verdict, which is repeated for the caller)."""

    def __init__(self, message: str, verdict: object = None) -> None:  # an ``_outcomes.Verdict``
        super().__init__(message)
        self.verdict = verdict
