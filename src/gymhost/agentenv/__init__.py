"""The import path of folders written before ``gymhost.environments`` (their ``app.py`` imports
``gymhost.agentenv.AgentEnvResourcesServer``): every public name of ``gymhost.environments``, under its old home.
New code imports ``gymhost.environments``."""

from __future__ import annotations

from typing import Any

from .. import environments
from ..environments import __all__ as __all__


def __getattr__(name: str) -> Any:
    return getattr(environments, name)
