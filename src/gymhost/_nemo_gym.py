"""The one place that decides whether nemo-gym is importable.

nemo-gym is an optional extra (it pulls Ray, MLflow and friends), so nothing at import time of ``gymhost``
may touch it; code that needs it calls ``require_nemo_gym()`` first and gets a clear install hint instead of
a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

from ._exceptions import NemoGymNotInstalledError

__all__ = ["require_nemo_gym"]

_REQUIRED = ("nemo_gym", "omegaconf")


def require_nemo_gym() -> str:
    """Import nemo-gym (and omegaconf), returning nemo-gym's version.

    Importing ``nemo_gym`` has process-wide side effects (0.7.0 reorders ``sys.path``, both versions replace
    ``builtins.print``), so callers that adjust ``sys.path`` must do it after this call, not before.
    """
    for module in _REQUIRED:
        if importlib.util.find_spec(module) is None:
            raise NemoGymNotInstalledError(module)
    importlib.import_module("nemo_gym")
    return importlib.metadata.version("nemo-gym")
