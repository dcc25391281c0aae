"""What a process of hosted code may reach: the code gymhost serves but did not write (a written bundle's
environment, agent-env's app), which the model acts through.

Its environment is an allow-list (``_environment``); gymhost's own secrets never reach it (``_config.take_secrets``
takes them out of the server's environment before any hosted code runs).
"""

from ._environment import PASSED, hosted_environment

__all__ = ["PASSED", "hosted_environment"]
