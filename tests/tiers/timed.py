"""A test tier's wall and CPU time, for the table `make test` ends with.

``python3 tests/tiers/timed.py NAME -- COMMAND...`` runs COMMAND, records its wall time and the CPU time of it and
every process it waited for (``RUSAGE_CHILDREN``: a server a test started and stopped is counted) in
``.test-times/NAME``, and exits with COMMAND's status. ``python3 tests/tiers/timed.py --table`` prints what was
recorded, slowest first, with when each began (after the first) and the share of two cores each kept busy: a tier
far under 100% spends its time waiting, and can run beside another; which ran beside which is in the "began"
column.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

TIMES = Path(os.environ.get("GYMHOST_TEST_TIMES", ".test-times"))


def run(name: str, command: list[str]) -> int:
    began = time.time()
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    status = subprocess.call(command)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    record = {
        "began": began,
        "wall_s": time.monotonic() - started,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "status": status,
    }
    TIMES.mkdir(exist_ok=True)
    (TIMES / name).write_text(json.dumps(record))
    return status


def table() -> str:
    records = {path.name: json.loads(path.read_text()) for path in TIMES.glob("*")} if TIMES.is_dir() else {}
    cores = os.cpu_count() or 1
    first = min((record["began"] for record in records.values() if "began" in record), default=0.0)
    lines = [f"{'tier':<22}{'began':>9}{'wall':>9}{'cpu':>9}{'busy':>7}  status", "-" * 65]
    for name, record in sorted(records.items(), key=lambda item: -item[1]["wall_s"]):
        busy = record["cpu_s"] / record["wall_s"] / cores if record["wall_s"] else 0.0
        status = "ok" if record["status"] == 0 else f"exit {record['status']}"
        began = _minutes(record["began"] - first) if "began" in record else ""
        times = f"{began:>9}{_minutes(record['wall_s']):>9}{_minutes(record['cpu_s']):>9}"
        lines.append(f"{name:<22}{times}{busy:>6.0%}  {status}")
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main(argv: list[str]) -> int:
    if argv == ["--table"]:
        print(table())
        return 0
    if len(argv) >= 3 and argv[1] == "--":
        return run(argv[0], argv[2:])
    print("usage: timed.py NAME -- COMMAND... | timed.py --table", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
