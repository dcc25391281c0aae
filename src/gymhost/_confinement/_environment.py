"""The environment variables a process of hosted code starts with: an allow-list, never the server's own.

A server's environment holds what its operator gave it (cloud credentials, API keys, a judge's key, proxy
passwords), and the code gymhost hosts (a bundle's environment, agent-env's app; each runs the model's actions) is
the one place none of it should reach. So such a process gets the few variables that make a Python process work the
same as its server (where programs and the home are, the locale, the time zone, the temporary directory, how Python
finds its modules and how many threads numerical libraries start) and what gymhost itself tells it, nothing else.
gymhost's own secret settings are not in ``os.environ`` at all by then (``_config.take_secrets``).
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["PASSED", "hosted_environment"]

# Passed on as the server has them, when it has them.
PASSED: Final = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONWARNINGS",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    }
)
_PASSED_PREFIXES: Final = ("LC_",)  # the locale's categories


def hosted_environment(**given: str) -> dict[str, str]:
    """The environment of a process that runs hosted code: ``PASSED`` from this process's, and ``given``."""
    passed = {name: value for name, value in os.environ.items() if name in PASSED or name.startswith(_PASSED_PREFIXES)}
    return {**passed, "PYTHONUNBUFFERED": "1", **given}
