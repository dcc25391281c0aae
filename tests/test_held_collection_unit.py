"""``gymhost serve`` and ``asgi.py`` build their app with the garbage collector held (``held_collection``): what
the build made is frozen once it is built, and the collector is on again afterwards, whether the build succeeded
or raised, as long as it was on before; a collector someone turned off stays off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gymhost._serving._run import held_collection

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_a_build_runs_with_the_collector_off_and_ends_with_it_on_and_its_objects_frozen() -> None:
    gc.enable()
    gc.unfreeze()
    with held_collection():
        assert not gc.isenabled()
        built = [[object()] for _ in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)


def test_a_build_that_raises_leaves_the_collector_on() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), held_collection():
        raise RuntimeError("the folder's app.py failed")
    assert gc.isenabled()


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    with held_collection():
        pass
    assert not gc.isenabled()
