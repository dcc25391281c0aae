"""The requirements of the image's nemo-gym: what serving a resources server imports, as nemo-gym itself pins it.

    python serving_requirements.py nemo_gym-0.7.0-py3-none-any.whl > serving.txt
    python serving_requirements.py --installed > serving.txt   # from the nemo-gym installed here (--no-deps)

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
# What the code a server runs on the model's behalf imports, as Gym's recordings show: nvarc's sandboxed subprocess
# runs the model's programs with the server's interpreter, and they import numpy and scipy (without them its replay
# scored 0.0 where the recording, and a full install, say 1.0: make test-replay-image). nemo-gym declares scipy.
FOR_HOSTED_CODE = frozenset({"scipy"})
# Not declared by nemo-gym (its other dependencies bring them in a full install): requests, which
# nemo_gym.server_utils imports at top level; numpy, for the code above.
UNDECLARED = ("requests", "numpy")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_by_wheel(wheel: str) -> list[str]:
    """The ``Requires-Dist`` values of a nemo-gym wheel."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return [line.partition(":")[2].strip() for line in lines if line.startswith("Requires-Dist:")]


def declared_by_installed() -> list[str]:
    """The ``Requires-Dist`` values of the nemo-gym installed beside this interpreter (the replay tier's venv of the
    image's set, ``make .venv-image/.installed``, built as the image is)."""
    from importlib.metadata import requires

    return requires("nemo-gym") or []


def requirements(declared: list[str], source: str) -> list[str]:
    kept = []
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name and canonical(name.group()) in SERVING | FOR_HOSTED_CODE and "extra ==" not in requirement:
            kept.append(requirement)
    missing = (SERVING | FOR_HOSTED_CODE) - {canonical(re.match(r"[A-Za-z0-9._-]+", line).group()) for line in kept}  # type: ignore[union-attr]
    if missing:
        raise SystemExit(f"{source} no longer declares {sorted(missing)}: check what serving imports")
    return [*kept, *UNDECLARED]


if __name__ == "__main__":
    if sys.argv[1:] == ["--installed"]:
        print("\n".join(requirements(declared_by_installed(), "the installed nemo-gym")))
    else:
        print("\n".join(requirements(declared_by_wheel(sys.argv[1]), sys.argv[1])))
