"""What a test run left behind, reported and removed: ``python3 tests/tiers/leftovers.py RUN_TMPDIR``.

``make test`` gives the whole run one temporary folder (``TMPDIR``), so everything the run and the programs it starts
write to temporary files (pytest's folders, gymhost's, uv's, Ray's, wandb's) lands there. At the end this lists the
processes still running with that ``TMPDIR`` in their environment (started by the run, so the run's to stop: each is
killed and named), then what is left in the folder, by kind, before the folder is removed. Nothing else is touched:
a process without the run's ``TMPDIR`` was not started by it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path


def run_processes(folder: str) -> dict[int, str]:
    """Every process, other than this one, whose environment names ``folder`` as its TMPDIR."""
    wanted = f"TMPDIR={folder}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def size_of(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def kind_of(name: str) -> str:
    """A leftover's kind: its name less the random part tempfile and others add."""
    return re.sub(r"[0-9a-z_]{8}$|[-_.][0-9a-f]{6,}$|\d+$", "*", name)


def main(folder: str) -> int:
    left = run_processes(folder)
    for pid, command in sorted(left.items()):
        print(f"leftovers: killing {pid}, still running after the tiers: {command[:200]}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    base = Path(folder)
    entries = list(base.iterdir()) if base.is_dir() else []
    kinds: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for entry in entries:
        kinds[kind_of(entry.name)] += 1
        sizes[kind_of(entry.name)] += size_of(entry)
    total = sum(sizes.values())
    print(f"leftovers: {len(left)} processes killed; {len(entries)} entries, {total / 1e6:.0f} MB in {folder}, removed")
    for kind, count in kinds.most_common(15):
        print(f"  {count:5d}  {sizes[kind] / 1e6:8.1f} MB  {kind}")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: leftovers.py RUN_TMPDIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
