"""The image's size and its time to ready (make bench-image, after make image).

Time to ready: from `podman run` to the first 200 of `/readyz` (the Kubernetes recipe's readiness probe), polled every
20 ms, for an installed Gym server by name and for the written gridsim folder mounted at run time (its pool's first
instances started), five starts each, as the container tier runs it (runc, host network, read-only root file
system, user 10001); and, once ready, the resident memory of the container's processes (their proportional set
sizes: a page the template and its instances share counts once). With GYMHOST_BASELINE_IMAGE (make bench-image
BASELINE_IMAGE=...), another image's starts are timed beside each case's, in turn (the order swapped every start),
and the ratios printed. Writes results/<date>-image.json (never over an earlier run's: -2, -3...) and prints the
table for README.md.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PODMAN = ["podman", "--runtime", "runc"]
IMAGE = os.environ.get("GYMHOST_IMAGE", "gymhost:latest")
BASELINE = os.environ.get("GYMHOST_BASELINE_IMAGE") or None
STARTS = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def limits() -> list[str]:
    hard = subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True, text=True, check=True).stdout.strip()
    return ["--ulimit", f"nofile={hard}:{hard}", "--ulimit", "nproc=4096:4096"]


def time_to_ready(image: str, options: list[str], arguments: list[str]) -> tuple[float, float]:
    """Seconds from ``podman run`` of ``image`` to ready, and the MB the container's processes hold then."""
    port, name = free_port(), f"gymhost-bench-{uuid.uuid4().hex[:8]}"
    command = [*PODMAN, "run", "-d", "--name", name, "--network", "host", "--read-only", *limits(), *options]
    command += ["-e", "GYMHOST_TOKEN=bench", image, *arguments, f"--port={port}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    ready = time.perf_counter() - started
                    break
            except httpx.TransportError:
                pass
            if time.perf_counter() - started > 180:
                raise RuntimeError(subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True).stderr)
            time.sleep(0.02)
        inspect = [*PODMAN, "inspect", name, "--format", "{{.State.Pid}}"]
        return ready, tree_pss_mb(int(subprocess.run(inspect, capture_output=True, text=True, check=True).stdout))
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True, check=False)


def tree_pss_mb(pid: int) -> float:
    """The proportional set size of a process and its descendants, in MB."""
    tree, frontier = {pid}, [pid]
    while frontier:
        children = []
        for parent in frontier:
            for task in Path(f"/proc/{parent}/task").iterdir():
                children += [int(child) for child in (task / "children").read_text().split()]
        tree.update(children)
        frontier = children
    total = 0
    for member in tree:
        rollup = Path(f"/proc/{member}/smaps_rollup").read_text()
        total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total / 1024


def main() -> None:
    images = [IMAGE, *([BASELINE] if BASELINE else [])]
    inspect = [*PODMAN, "image", "inspect", "--format", "{{.Size}}"]
    sizes = {
        image: int(subprocess.run([*inspect, image], capture_output=True, text=True, check=True).stdout)
        for image in images
    }
    sys.path.insert(0, str(REPO / "src"))
    from gymhost.environments import write_folder

    with tempfile.TemporaryDirectory() as work:
        folder = write_folder(str(REPO / "examples" / "gridsim_v1"), Path(work) / "root").path
        subprocess.run(["chmod", "-R", "a+rX", work], check=True)
        cases = {
            "installed Gym server by name (example_single_tool_call)": ([], ["example_single_tool_call"]),
            "the same, --workers=2": ([], ["example_single_tool_call", "--workers=2"]),
            "written gridsim folder, mounted": (["-v", f"{folder}:/srv/gym:ro", "-e", "GYMHOST_FOLDER=/srv/gym"], []),
        }
        starts: dict[str, dict[str, list[tuple[float, float]]]] = {image: {} for image in images}
        for case, given in cases.items():
            for start in range(STARTS):
                for image in images if start % 2 == 0 else images[::-1]:
                    starts[image].setdefault(case, []).append(time_to_ready(image, *given))
    measured = {
        image: {
            "size_bytes": sizes[image],
            "time_to_ready_s": {case: [ready for ready, _ in runs] for case, runs in by_case.items()},
            "ready_pss_mb": {case: [round(mb, 1) for _, mb in runs] for case, runs in by_case.items()},
        }
        for image, by_case in starts.items()
    }
    record = {
        "date": datetime.date.today().isoformat(),
        "image": IMAGE,
        "cores": os.cpu_count(),
        **measured[IMAGE],
        **({"baseline": {"image": BASELINE, **measured[BASELINE]}} if BASELINE else {}),
    }
    out = HERE / "results" / f"{record['date']}-image.json"
    for number in range(2, 100):
        if not out.exists():
            break
        out = HERE / "results" / f"{record['date']}-image-{number}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{out.relative_to(HERE)}")
    for image in images:
        print(f"\nimage {image}: {sizes[image] / 1e9:.2f} GB\n")
        print(f"| served | time to ready, median (min-max) of {STARTS} starts | memory once ready (PSS), median |")
        print("|---|---|---|")
        for case, times in measured[image]["time_to_ready_s"].items():
            ready = f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})"
            print(f"| {case} | {ready} | {statistics.median(measured[image]['ready_pss_mb'][case]):.0f} MB |")
    if BASELINE:
        print(f"\n{IMAGE} against {BASELINE}, time to ready (ratio of the medians):")
        for case, times in measured[IMAGE]["time_to_ready_s"].items():
            base = measured[BASELINE]["time_to_ready_s"][case]
            print(f"- {case}: {statistics.median(times) / statistics.median(base):.2f}")


if __name__ == "__main__":
    main()
