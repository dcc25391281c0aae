"""``python -m gymhost._confinement._probe RULES``, run in a sandbox as a template would be: it confines itself as
one (``enter_template``), then forks a confined instance as a template does (``fork_instance``), which writes to
its scratch (its working directory) and still finds the interpreter's files; it says ``confined`` when all of that
worked (``_choice``)."""

from __future__ import annotations

import os
import sys

from ._landlock import scratch_of
from ._rules import Rules, enter_template, fork_instance


def main(argument: str) -> None:
    rules = Rules.from_argument(argument)
    enter_template(rules)
    try:  # the instance says itself why, when it cannot confine itself
        child, pidfd = fork_instance(rules, scratch_of(os.path.join(rules.hidden[0], "probe")))
    except OSError as error:
        sys.exit(f"an instance could not be made: {error}")
    if child == 0:
        try:
            with open("scratch", "w") as scratch:  # its own scratch, its working directory, is writable
                scratch.write("ok")
            os.listdir(sys.prefix)  # and the interpreter is still in sight (a venv in /tmp is bound again)
        except BaseException as error:
            print(f"a confined instance could not work: {error}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    if status is not None and status.si_status == 0:
        print("confined", flush=True)
    else:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
