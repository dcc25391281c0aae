"""The one place that decides whether nemo-gym is importable, and what gymhost knows of it without importing it.

nemo-gym is an optional extra (it pulls Ray, MLflow and friends), so nothing at import time of ``gymhost``
may touch it; code that needs it calls ``require_nemo_gym()`` first and gets a clear install hint instead of
a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

from ._deferred_imports import defer_training_imports
from ._exceptions import NemoGymNotInstalledError

__all__ = [
    "CANCELLED",
    "GYM_ROUTE_NAMES",
    "LIVENESS_ROUTES",
    "PROVIDER_UNAVAILABLE",
    "READINESS_ROUTE",
    "SESSION_EXPIRED",
    "SESSION_LOST",
    "SHUTDOWN",
    "require_nemo_gym",
    "verdicts_carry_mask",
]

# Failure kinds of nemo-gym's shared vocabulary (``nemo_gym.failure_kinds``, 0.7.0) that gymhost's core answers with
# or tells apart: an episode whose owner is gone, one that expired or was cancelled, and a server that takes no
# episode now or is shutting down. The environments' own are in their ``_outcomes``.
SESSION_LOST = "session_lost"
SESSION_EXPIRED = "session_expired"
CANCELLED = "cancelled"
PROVIDER_UNAVAILABLE = "provider_unavailable"
SHUTDOWN = "shutdown"

# Gym's liveness routes: the process answers, nothing more. nemo-gym 0.4.0 serves "/" alone, 0.5+ all four; every
# app gymhost builds answers all four itself, on every version (``_hosting._operating``), and a token never guards
# them (``middleware.auth``).
LIVENESS_ROUTES = ("/", "/health", "/healthz", "/livez")
# Gym's readiness route (0.5+), which answers ok whatever the state; gymhost's replaces it (``_hosting._operating``).
READINESS_ROUTE = "/readyz"

# Paths a Gym resources server serves itself (nemo-gym 0.4.0 and 0.7.0, liveness and docs included); every other
# single-segment POST route of a resources server is a tool.
GYM_ROUTE_NAMES = frozenset(
    {
        "seed_session",
        "verify",
        "close_session",
        "aggregate_metrics",
        "reverify_mode",
        "mcp",
        "docs",
        "redoc",
        "ng-rollout",
        *(path.lstrip("/") for path in (*LIVENESS_ROUTES, READINESS_ROUTE) if path != "/"),
    }
)

_REQUIRED = ("nemo_gym", "omegaconf")


def require_nemo_gym() -> str:
    """Import nemo-gym (and omegaconf), returning nemo-gym's version.

    Importing ``nemo_gym`` has process-wide side effects (0.7.0 reorders ``sys.path``, both versions replace
    ``builtins.print``), so callers that adjust ``sys.path`` must do it after this call, not before. Its training-time
    dependencies are imported at first use (``_deferred_imports``).
    """
    for module in _REQUIRED:
        if importlib.util.find_spec(module) is None:
            raise NemoGymNotInstalledError(module)
    defer_training_imports()
    importlib.import_module("nemo_gym")
    return importlib.metadata.version("nemo-gym")


def verdicts_carry_mask() -> bool:
    """Whether this nemo-gym's verify answer has ``mask_sample`` (0.5+): whether Gym's own clients of this version
    read it (``middleware.masked_verdicts.launcher_mode``)."""
    from nemo_gym.base_resources_server import BaseVerifyResponse

    return "mask_sample" in BaseVerifyResponse.model_fields
