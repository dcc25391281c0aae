"""The errors gymhost raises. Catch ``GymhostError`` for anything gymhost refused, or a narrower class to act on
one kind of problem. Every message names the path or name involved and what was expected there, so the command line
can print it as one line and the user can fix it without reading a traceback.

The whole tree, this module's classes and the environments' (``gymhost.environments._errors``; the ones a user meets
are exported from ``gymhost.environments``, the others become a masked verdict or an HTTP answer inside a server)::

    GymhostError
    ├── NemoGymNotInstalledError (ImportError)   nemo-gym, an optional extra, is needed here
    ├── FolderError                              a folder Gym's launcher would not accept
    │   └── ServerClassError                     its entrypoint names no single server class
    ├── GatewayError                             servers that cannot be mounted together
    ├── UnmappedServerError (LookupError)        a call to a Gym server nobody mapped
    ├── UpstreamUnavailableError (ConnectionError)
    ├── ServeError                               a server that cannot start
    │   └── ConfinementError                     --sandbox strict where namespaces are not allowed
    │                                                                    -- environments: writing, checking a folder
    ├── TaskError, SourceError, CatalogError, WriteError, CheckError
    │                                                                    -- environments: the pool and its instances
    ├── StartupError                             instances that would not come up, or disagree
    ├── PoolExhaustedError                       no instance came free in time
    ├── EnvUnavailableError                      an instance that did not answer
    │   ├── EnvTimeoutError, EnvDroppedError, EnvAtCapacityError
    │   └── InstanceLimitError (an EnvDroppedError)  an instance that reached a limit and stopped
    ├── DataPlaneError                           an instance that answered with an error
    │   ├── EnvFailedError                       the environment ended the episode itself
    │   └── MalformedReplyError                  an answer outside the protocol: the instance is broken
    ├── ExtensionError                           a grade extension that could not be called
    ├── McpSessionError                          an MCP session that failed or is gone
    │   └── McpMalformedReplyError (also MalformedReplyError): classified as malformed, the instance broken
    │                                                                    -- environments: episodes
    ├── UnknownTaskError (LookupError), SessionConflictError
    └── EpisodeStateError                        a call the episode is not in a state for
"""

from __future__ import annotations

__all__ = [
    "ConfinementError",
    "FolderError",
    "GatewayError",
    "GymhostError",
    "NemoGymNotInstalledError",
    "ServeError",
    "ServerClassError",
    "UnmappedServerError",
    "UpstreamUnavailableError",
]


class GymhostError(Exception):
    """Base class of every error gymhost raises on purpose."""


class NemoGymNotInstalledError(GymhostError, ImportError):
    """Building or serving a resources server needs nemo-gym, which is an optional extra."""

    def __init__(self, missing: str = "nemo_gym") -> None:
        super().__init__(
            f"{missing} is not installed; gymhost needs it to build resources servers: pip install nemo-gym omegaconf "
            "(or install gymhost with its extra: pip install '.[nemo-gym]' in a checkout, or "
            "pip install 'gymhost-VERSION-py3-none-any.whl[nemo-gym]' from a wheel)"
        )


class FolderError(GymhostError):
    """A resources-server folder is not what NeMo Gym's launcher would accept."""


class ServerClassError(FolderError):
    """The entrypoint does not name exactly one resources-server class."""


class GatewayError(GymhostError):
    """The servers cannot be mounted together: a bad prefix, or folders that cannot share a process."""


class UnmappedServerError(GymhostError, LookupError):
    """A resources server called another Gym server that nobody told gymhost where to find.

    Gym's own client would retry such a call forever; failing at once tells the operator which
    ``--server-url NAME=URL`` is missing.
    """


class UpstreamUnavailableError(GymhostError, ConnectionError):
    """A mapped Gym server did not accept connections after a few tries."""


class ServeError(GymhostError):
    """A server could not start: the address is taken, the host cannot be bound, or a setting is unusable."""


class ConfinementError(ServeError):
    """``--sandbox strict`` asked for hosted code confined in namespaces, and this machine does not allow them, or
    the code is of a kind gymhost never confines (a bundle served in-process, agent-env's app)."""
