"""What a process of hosted code may reach: the code gymhost serves but did not write (a written bundle's
environment, agent-env's app, a Gym server under ``--sandbox strict``), which the model acts through.

One interface (``_base.Confinement``), chosen once a process (``confinement``, from ``--sandbox``), with the levels
as its backends: ``namespaces`` (``_bubblewrap``; each instance then confines itself, ``_rules``), ``landlock``
(``_landlock``, where no namespaces may be made), and ``limits`` and ``none`` (``_unconfined``). Whatever the
level, a bundle's template and instances and agent-env's app get an allow-list of the environment
(``_environment``; a Gym server's own process keeps the server's), gymhost's own secrets are not in the server's
(``_config.take_secrets``), and nothing of the server's descriptors reaches hosted code (``gymhost._descriptors``).
"""

from ._base import DEFAULT_SCRATCH_BYTES, Confinement, Level
from ._choice import confinement, find_bwrap, refuse_under_strict
from ._environment import PASSED, hosted_environment
from ._landlock import scratch_of
from ._limits import LIMIT_KINDS, Limits, Reached, watch
from ._rules import (
    Rules,
    drop_privileges,
    enter_instance,
    enter_server,
    enter_template,
    fork_instance,
    not_dumpable,
)

__all__ = [
    "DEFAULT_SCRATCH_BYTES",
    "LIMIT_KINDS",
    "PASSED",
    "Confinement",
    "Level",
    "Limits",
    "Reached",
    "Rules",
    "confinement",
    "drop_privileges",
    "enter_instance",
    "enter_server",
    "enter_template",
    "find_bwrap",
    "fork_instance",
    "hosted_environment",
    "not_dumpable",
    "refuse_under_strict",
    "scratch_of",
    "watch",
]
