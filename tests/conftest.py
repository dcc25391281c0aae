"""Tiers and shared fixtures.

Every test is marked ``unit`` (runs without nemo-gym) or ``nemo_gym`` (needs it; ``make test`` runs this tier once
per supported nemo-gym version). A tier that cannot run here fails instead of skipping: a tier that silently
passes would hide exactly the breakage it exists to catch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

TIERS = {"unit", "nemo_gym"}
REPO = Path(__file__).resolve().parent.parent

# A server with no GYMHOST_SECRET keeps the secret it makes in the user's state directory: the servers the tests
# start keep theirs in the run's temporary folder (make test removes it), never in the home of whoever runs them.
os.environ["XDG_STATE_HOME"] = str(Path(tempfile.gettempdir()) / "gymhost-tests-state")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = {mark.name for mark in item.iter_markers()} & TIERS
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: mark it with exactly one tier of {sorted(TIERS)}")


def pytest_collection_finish(session: pytest.Session) -> None:
    wants_gym = any(item.get_closest_marker("nemo_gym") for item in session.items)
    if wants_gym and importlib.util.find_spec("nemo_gym") is None:
        raise pytest.UsageError("the nemo_gym tier needs nemo-gym installed; run it through `make test`")


@pytest.fixture(autouse=True)
def secrets_of_this_test_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """gymhost takes GYMHOST_SECRET and GYMHOST_TOKEN out of the environment as it reads them, and keeps them for
    the life of the process (``_config.take_secrets``): each test starts with none taken, as a process starts."""
    config = sys.modules.get("gymhost._config")  # not imported yet (or not installed: the manifests' venv): none taken
    if config is not None:
        monkeypatch.setattr(config, "_taken", {})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def without_nemo_gym() -> None:
    """For tests of what a user without the nemo-gym extra sees; wrong venv is a failure, not a skip."""
    if importlib.util.find_spec("nemo_gym") is not None or importlib.util.find_spec("omegaconf") is not None:
        pytest.fail("this test must run where nemo-gym and omegaconf are not installed (the unit tier's venv)")


@pytest.fixture(scope="session")
def gym_root() -> Path:
    """The ``resources_servers`` folder the installed nemo-gym wheel ships."""
    spec = importlib.util.find_spec("resources_servers")
    assert spec is not None, "nemo-gym ships resources_servers/"
    assert spec.submodule_search_locations, "nemo-gym ships resources_servers/"
    for location in spec.submodule_search_locations:
        if (Path(location) / "example_single_tool_call").is_dir():
            return Path(location)
    raise AssertionError("the installed nemo-gym has no resources_servers/example_single_tool_call")


@pytest.fixture(scope="session")
def gym_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in version("nemo-gym").split(".")[:2])


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No inherited Gym launcher variables: they would change how nemo-gym reads its config."""
    for name in ("NEMO_GYM_CONFIG_DICT", "NEMO_GYM_CONFIG_PATH", "GYMHOST_FOLDER"):
        monkeypatch.delenv(name, raising=False)
