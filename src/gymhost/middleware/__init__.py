"""gymhost's ASGI middleware, each pure ASGI (no ``BaseHTTPMiddleware``), kept as Starlette keeps its own.

``stack.middleware_stack`` is the one place that says which of them an app gets, in which order, and why.
"""

from __future__ import annotations

from .._sessions._cookie import GymSessionMiddleware
from .._sessions._ownership import SessionOwnershipMiddleware
from .auth import LIVENESS_PATHS, BearerTokenMiddleware
from .disconnect import DisconnectCancellationMiddleware
from .gym_errors import GymErrorsMiddleware
from .masked_verdicts import MaskedVerdictsMiddleware
from .request_guard import RequestGuardMiddleware
from .stack import middleware_stack

__all__ = [
    "LIVENESS_PATHS",
    "BearerTokenMiddleware",
    "DisconnectCancellationMiddleware",
    "GymErrorsMiddleware",
    "GymSessionMiddleware",
    "MaskedVerdictsMiddleware",
    "RequestGuardMiddleware",
    "SessionOwnershipMiddleware",
    "middleware_stack",
]
