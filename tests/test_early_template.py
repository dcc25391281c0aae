"""A template started before the server's event loop (``BundleLauncher.start_early``, ``gymhost serve``'s head start):
adopted by the launcher that would have started the same one, stopped and replaced by one that would not. Real
template and instance processes, confined as a server's are by default; ``gymhost serve``'s own use of it is tested
in test_agentenv_server.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gymhost._confinement import Limits
from gymhost.environments._agentenv import _forking
from gymhost.environments._agentenv._forking import BundleLauncher, stop_early
from gymhost.environments._settings import PoolSettings

from .agentenv_helpers import GRIDSIM, until_described
from .processes import STATE_TIMEOUT_S, alive, assert_none_naming, descendants

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


@pytest.fixture
def no_early_template_left() -> Iterator[None]:
    yield
    stop_early()


@pytest.mark.usefixtures("no_early_template_left")
async def test_the_launcher_that_would_start_the_same_template_adopts_it() -> None:
    BundleLauncher(GRIDSIM).start_early(Path.cwd())
    assert _forking._early is not None
    early = _forking._early.popen.pid
    launcher = BundleLauncher(GRIDSIM)
    try:
        instance = await launcher.launch(0, PoolSettings())
        await until_described(instance)
        assert _forking._early is None
        assert instance.process is not None
        assert instance.process.pid in descendants(early)
        await launcher.stop(instance)
    finally:
        await launcher.close()
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while alive(early) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(early), "the adopted template outlived its launcher"


@pytest.mark.usefixtures("no_early_template_left")
async def test_a_launcher_that_would_start_another_template_stops_the_early_one_and_starts_its_own() -> None:
    BundleLauncher(GRIDSIM, limits=Limits(processes=64)).start_early(Path.cwd())
    assert _forking._early is not None
    early, folder = _forking._early.popen.pid, _forking._early.start.folder
    launcher = BundleLauncher(GRIDSIM, limits=Limits(processes=128))
    try:
        instance = await launcher.launch(0, PoolSettings())
        await until_described(instance)
        assert not alive(early)
        assert_none_naming(str(folder), "the early template's processes")
        assert not folder.exists()
        assert instance.process is not None
        assert instance.process.pid not in descendants(early)
        await launcher.stop(instance)
    finally:
        await launcher.close()


@pytest.mark.usefixtures("no_early_template_left")
def test_a_template_no_launcher_adopted_is_stopped_with_its_folder() -> None:
    BundleLauncher(GRIDSIM).start_early(Path.cwd())
    assert _forking._early is not None
    early, folder = _forking._early.popen.pid, _forking._early.start.folder
    assert alive(early)
    assert folder.is_dir()
    stop_early()
    assert not alive(early)
    assert_none_naming(str(folder), "the early template's processes")
    assert not folder.exists()
    assert _forking._early is None
