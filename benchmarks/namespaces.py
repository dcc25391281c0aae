"""What each namespace of a confined instance costs the machine, start to end (make bench-namespaces).

A confined instance is made by one ``clone3`` with user, mount, IPC, PID and network namespaces of its own
(``gymhost._confinement._rules.fork_instance``). Here that same call (``_rules._clone3``) forks this process with
each set of those flags in turn, the child exits at once and the parent waits for it, ``FORKS`` times a set, in
rounds whose order is reversed every other round. Per fork: the wall time of clone, exit and wait, and the
machine's CPU (``/proc/stat``, every core, the kernel's deferred teardown of the namespaces included: each set's
count runs on for a second after its last fork). As root (a root server's instances are made the same way).
Writes results/<date>-namespaces.json and prints the table for README.md.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import run

from gymhost._confinement import _rules  # this checkout's

HERE = Path(__file__).resolve().parent
FORKS, ROUNDS, SETTLE_S = 200, 3, 1.0
_OTHERS = os.CLONE_NEWNS | os.CLONE_NEWIPC | os.CLONE_NEWPID
SETS = {
    "a plain fork": 0,
    "user": os.CLONE_NEWUSER,
    "user, mount, IPC, PID": os.CLONE_NEWUSER | _OTHERS,
    "user, network": os.CLONE_NEWUSER | os.CLONE_NEWNET,
    "user, mount, IPC, PID, network (an instance's)": os.CLONE_NEWUSER | _OTHERS | os.CLONE_NEWNET,
}


def forks(flags: int) -> tuple[float, float]:
    """Microseconds a fork of ``flags``: wall, and the machine's CPU."""
    time.sleep(SETTLE_S)  # the last set's deferred teardown done before this one's count starts
    cpu, wall = run.machine_cpu_s(), time.perf_counter()
    for _ in range(FORKS):
        pid, pidfd = _rules._clone3(flags | _rules._CLONE_PIDFD)
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        os.close(pidfd)
    wall = time.perf_counter() - wall
    time.sleep(SETTLE_S)  # and this set's own, counted
    return wall / FORKS * 1e6, (run.machine_cpu_s() - cpu) / FORKS * 1e6


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("namespaces.py: run as root, as a root server makes its instances")
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in SETS}
    for number in range(ROUNDS):
        order = list(SETS.items())
        for name, flags in order if number % 2 == 0 else reversed(order):
            rounds[name].append(forks(flags))
    rows = {
        name: {
            "wall_us": round(statistics.median(wall for wall, _ in measured)),
            "machine_cpu_us": round(statistics.median(cpu for _, cpu in measured)),
            "machine_cpu_us_of_each_round": [round(cpu) for _, cpu in measured],
        }
        for name, measured in rounds.items()
    }
    plain = rows["a plain fork"]["machine_cpu_us"]
    results = {"forks": FORKS, "rounds": ROUNDS, "machine": run.machine(), "sets": rows}
    path = run.results_path(f"{datetime.date.today().isoformat()}-namespaces")
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(path.relative_to(HERE))
    print("\n| namespaces | wall a fork, µs | machine CPU a fork, µs | beyond a plain fork |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        extra = row["machine_cpu_us"] - plain
        print(f"| {name} | {row['wall_us']:,} | {row['machine_cpu_us']:,} | {'' if not extra else f'{extra:+,}'} |")


if __name__ == "__main__":
    main()
