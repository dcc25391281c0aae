"""The requirements of the image's nemo-gym: what serving a resources server imports, as nemo-gym itself pins it.

    python serving_requirements.py nemo_gym-0.7.0-py3-none-any.whl > serving.txt

The image installs nemo-gym without its dependencies (``pip install --no-deps``) and these beside it: nemo-gym
declares its launcher's, training's and profiling's too (Ray, pyarrow, SciPy, pandas, MLflow, W&B: about 0.9 GB of
the 1.1 GB it pulls in), which a resources server never imports as it serves (gymhost defers the imports of the
Gym modules that name them at top level: ``gymhost._deferred_imports``). Each line is nemo-gym's own requirement,
read from the wheel's metadata, for the distributions in ``SERVING``: the names were found by serving an installed
Gym server by name and a written folder, in-process and in process mode, and reading what they imported
(benchmarks/README.md, "The image"); their versions stay nemo-gym's. ``UNDECLARED``: what nemo-gym imports without
declaring it (its other dependencies bring it in a full install).
"""

from __future__ import annotations

import re
import sys
import zipfile

SERVING = frozenset(
    {
        "aiohttp",
        "anyio",
        "fastapi",
        "httptools",
        "itsdangerous",
        "mcp",
        "omegaconf",
        "openai",
        "orjson",
        "packaging",
        "pydantic",
        "pydantic-core",
        "pydot",
        "pyjwt",
        "python-multipart",
        "rich",
        "tqdm",
        "urllib3",
        "uvicorn",
        "uvloop",
        "yappi",
    }
)
UNDECLARED = ("requests",)  # nemo_gym.server_utils imports it at top level


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    kept = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.partition(":")[2].strip()
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name and canonical(name.group()) in SERVING and "extra ==" not in requirement:
            kept.append(requirement)
    missing = SERVING - {canonical(re.match(r"[A-Za-z0-9._-]+", line).group()) for line in kept}  # type: ignore[union-attr]
    if missing:
        raise SystemExit(f"{wheel} no longer declares {sorted(missing)}: check what serving imports")
    return [*kept, *UNDECLARED]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
