"""Put on PYTHONPATH by the replay tier for folders whose manifest entry has ``verify_time_limit_s``.

math-verify (``math_with_judge``'s verifier) gives each comparison 5 s of wall time, a default ``math_metric`` does not
let a caller change. Row 1 of the recording compares two expressions of about 10^1150 (sympy's ``simplify`` of their
difference): 5 to 15 s of CPU on these machines, so whether it replays Gym's recorded 1.0 depends on the machine's
speed and load. Raised, the comparison always finishes, and gives the recorded verdict on any machine.
"""

import os

_LIMIT = os.environ.get("GYMHOST_REPLAY_MATH_VERIFY_TIMEOUT_S")
if _LIMIT:
    try:
        import math_verify.grader as _grader
    except ImportError:  # a process of the tier's own venv, before the folder's venv runs the server
        pass
    else:
        _code = _grader.verify.__code__
        _names = _code.co_varnames[: _code.co_argcount]
        _defaults = list(_grader.verify.__defaults__ or ())
        _defaults[_names.index("timeout_seconds") - (len(_names) - len(_defaults))] = int(_LIMIT)
        _grader.verify.__defaults__ = tuple(_defaults)
