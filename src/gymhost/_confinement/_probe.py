"""``python -m gymhost._confinement._probe RULES``, run in a sandbox as a hosted process would be: it drops its
privileges, then confines a forked child as an instance, which writes to its scratch and still finds the
interpreter's files; it says ``confined`` when all of that worked (``_choice``)."""

from __future__ import annotations

import os
import sys

from ._rules import Rules, drop_privileges, enter_instance


def main(argument: str) -> None:
    rules = Rules.from_argument(argument)
    drop_privileges(rules)
    child = os.fork()
    if child == 0:
        try:
            enter_instance(rules)
            with open("/tmp/scratch", "w") as scratch:  # its own scratch is writable
                scratch.write("ok")
            os.listdir(sys.prefix)  # and the interpreter is still in sight (a venv in /tmp is bound again)
        except BaseException as error:
            print(f"an instance could not confine itself: {error}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        print("confined", flush=True)
    else:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
