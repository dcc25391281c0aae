"""The template's heap made immortal (``_immortal``): a child forked after it reads the objects it inherited without
copying their pages, and objects keep working. Run in a process of its own: immortal objects are never freed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, resource, sys
    from gymhost.environments._agentenv._immortal import _known_interpreter, immortalize

    inherited = [{"n": n, "name": f"object {n}"} for n in range(100_000)]

    def faults_of_a_child_reading_them():
        reading, writing = os.pipe()
        child = os.fork()
        if child == 0:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            total = sum(len(value["name"]) for value in inherited)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            os.write(writing, json.dumps([faults, total]).encode())
            os._exit(0)
        os.close(writing)
        answer = json.loads(os.read(reading, 1000))
        os.waitpid(child, 0)
        return answer

    mortal = faults_of_a_child_reading_them()
    made = immortalize()
    immortal = faults_of_a_child_reading_them()
    counted = sys.getrefcount(inherited[7])
    held = [inherited[7]] * 5
    inherited[7]["n"] = "changed"
    later = {"made": "after"}
    print(json.dumps({
        "known": _known_interpreter(), "mortal": mortal, "immortal": immortal, "made": made,
        "count_kept": sys.getrefcount(inherited[7]) == counted,
        "later_counted": sys.getrefcount(later) < 10,
        "still_works": inherited[7]["n"] == "changed" and len(held) == 5,
    }))
    """
)


def test_a_child_reads_what_it_inherited_without_copying_it() -> None:
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(ran.stdout)
    assert seen["known"] == (sys.version_info[:2] in ((3, 12), (3, 13)))  # the CPythons gymhost supports
    if not seen["known"]:  # a free-threaded build, a later CPython: nothing written, and nothing else changes
        assert seen["made"] == 0
        assert seen["still_works"]
        return
    (mortal_faults, mortal_total), (immortal_faults, immortal_total) = seen["mortal"], seen["immortal"]
    assert mortal_total == immortal_total
    assert seen["made"] >= 200_000  # the dicts and their strings
    # Reading 100,000 dicts wrote the count of each (and of each string), a page copied per 4 KB; now none.
    assert mortal_faults > 1_000
    assert immortal_faults < mortal_faults / 10
    assert seen["count_kept"]
    assert seen["later_counted"]
    assert seen["still_works"]
