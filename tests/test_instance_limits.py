"""What a confined process instance may take (issue 43, items 2, 3 and 7), on a real ``gymhost serve`` whose
instances are real processes in real namespaces, with the limits given on its command line.

The hog battery: a tool takes more than its instance may, each way the issue names: 3 GiB of memory under a 1 GiB
limit, 600 processes under 256 (the tool catches the failure and answers, as code that swallows errors does), a
file past the scratch's 512 MiB, a CPU spin past 3 s of CPU. Each time the episode that did it is masked with the
limit's failure_kind (never scored), an episode open beside it on another instance plays on and scores, the pool
heals (the next episode scores), ``/metrics`` counts the stop by the limit's name, the log names the limit, and no
process outlives the server. And nothing of one episode reaches the next: a file in its scratch and a module
global, both gone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient
from gymhost.environments import write_folder

from .agentenv_helpers import COUNTER_ENV, make_bundle, pool_status_of, rows
from .fault_helpers import wait_for
from .processes import (
    ServerProcess,
    alive,
    assert_stopped_cleanly,
    descendants,
    gymhost_command,
    serving,
    without_user_namespaces,
)
from .verdicts import verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

# The counter bundle with a tool that takes too much, and one that leaves things behind for the next episode.
HOG_ENV = COUNTER_ENV.replace(
    """    @tool(name="stall")""",
    '''    @tool(name="hog")
    async def hog(self, what: str, amount: int) -> dict[str, Any]:
        """Take ``amount`` of ``what``: MiB of memory, processes, MiB of one file, seconds of spinning."""
        import subprocess
        import time

        if what == "memory":
            return {"held": len(bytearray(amount << 20))}
        if what == "processes":
            started = []
            try:
                for _ in range(amount):
                    started.append(subprocess.Popen(["sleep", "600"]))
            except OSError as error:  # swallowed: the limit must be noticed all the same
                return {"started": len(started), "error": str(error)}
            return {"started": len(started)}
        if what == "file":
            with open("/tmp/big", "wb") as file:
                for _ in range(amount):
                    file.write(b"x" * (1 << 20))
            return {"written": amount}
        deadline = time.monotonic() + amount
        while time.monotonic() < deadline:
            pass
        return {"spun": amount}

    @tool(name="leave")
    async def leave(self) -> dict[str, Any]:
        """What an earlier episode on this process left (a file in the scratch, a module global); then leave both."""
        import os

        found = {"file": os.path.exists("/tmp/left-behind"), "global": globals().get("LEFT_BEHIND")}
        with open("/tmp/left-behind", "w") as file:
            file.write("from an earlier episode")
        globals()["LEFT_BEHIND"] = "from an earlier episode"
        return found

    @tool(name="stall")''',
).replace("{TOOL}", "increment")

RLIMITS = {"memory": "RLIMIT_DATA", "processes": "RLIMIT_NPROC", "file_size": "RLIMIT_FSIZE", "cpu_time": "RLIMIT_CPU"}
LIMITS = ("--instance-memory", "1GiB", "--instance-pids", "256", "--instance-cpu", "3")

# Each hog: what it takes, and the failure_kind and metric reason its episode must end with.
HOGS = {
    "3 GiB under 1 GiB": ({"what": "memory", "amount": 3072}, "provider_oom_killed", "memory"),
    "600 processes under 256": ({"what": "processes", "amount": 600}, "sandbox:process_limit", "processes"),
    "a file past the scratch": ({"what": "file", "amount": 600}, "sandbox:file_size_limit", "file_size"),
    "a spin past 3 s of CPU": ({"what": "cpu", "amount": 60}, "sandbox:cpu_limit", "cpu_time"),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("limits")
    bundle = make_bundle(root / "bundles")
    (bundle / "env.py").write_text(HOG_ENV)
    return write_folder(str(bundle), root / "root", instances=2, mode="process").path


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    """One server for the battery, one hog after another: a pool that does not heal fails the next test too."""
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict", *LIMITS)) as running:
        yield running
    assert_stopped_cleanly(running)
    assert not [pid for pid in descendants(running.process.pid) if alive(pid)]


def stops(server: ServerProcess) -> dict[str, float]:
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    found = re.findall(r'gymhost_instance_stops_total\{mount="/",reason="(\w+)"\} ([0-9.]+)', metrics)
    return {reason: float(count) for reason, count in found}


def pool_is_whole(server: ServerProcess) -> None:
    wait_for("both instances free", lambda: pool_status_of(server.url)["free"] == 2)


@pytest.mark.parametrize("hog", HOGS)
async def test_an_instance_past_a_limit_is_stopped_and_its_episode_masked(
    server: ServerProcess, folder: Path, hog: str
) -> None:
    arguments, failure_kind, reason = HOGS[hog]
    row = rows(folder)[0]
    pool_is_whole(server)
    before = stops(server).get(reason, 0.0)
    async with EpisodeClient(server.url) as beside, EpisodeClient(server.url) as greedy:
        await beside.seed(row)
        await greedy.seed(row)
        answer = await greedy.post("/hog", arguments)
        assert answer.status_code == 503, answer.text  # the environment is unavailable: the call is not the model's
        masked = await verdict(greedy, row)
        assert (masked["reward"], masked["mask_sample"], masked["failure_kind"]) == (0.0, True, failure_kind), masked
        assert "reached its" in masked["failure_reason"], masked
        # The other episode, on the other instance, never noticed.
        assert (await beside.call_tool("increment", {"by": 2})).ok
        scored = await beside.verify(row)
        assert (scored["reward"], scored["mask_sample"]) == (1.0, False), scored
    # Counted as the pool sees the instance's end, which may come after the verdict: waited for.
    wait_for(f"the stop counted as {reason}", lambda: stops(server).get(reason, 0.0) == before + 1)
    said = rf"environment instance \d+: the environment instance reached its .*{RLIMITS[reason]}.*; replacing it"
    assert re.search(said, server.output), server.output
    pool_is_whole(server)  # healed: and the next episode on it scores
    async with EpisodeClient(server.url) as after:
        await after.seed(row)
        assert (await after.call_tool("increment", {"by": 2})).ok
        assert (await after.verify(row))["reward"] == 1.0


@pytest.mark.parametrize("landlock", [True, False])
async def test_where_no_namespaces_may_be_made_auto_still_holds_an_instance_to_its_limits(
    folder: Path, landlock: bool
) -> None:
    """``auto`` on a machine that refuses user namespaces restricts the instances with Landlock (level ``landlock``),
    or, where that is refused too, runs them unconfined (level ``limits``): each is still stopped at its limits,
    and its episode masked."""
    serve = gymhost_command("serve", str(folder), "--port", "0", "--instance-memory", "1GiB")
    row = rows(folder)[0]
    with serving(without_user_namespaces(serve, landlock=landlock)) as server:
        assert pool_status_of(server.url)["confinement"] == ("landlock" if landlock else "limits")
        async with EpisodeClient(server.url) as greedy:
            await greedy.seed(row)
            answer = await greedy.post("/hog", {"what": "memory", "amount": 3072})
            assert answer.status_code == 503, answer.text
            masked = await verdict(greedy, row)
        assert (masked["mask_sample"], masked["failure_kind"]) == (True, "provider_oom_killed"), masked
        wait_for("the stop counted as memory", lambda: {k: v for k, v in stops(server).items() if v} == {"memory": 1.0})


async def test_nothing_of_one_episode_reaches_the_next(server: ServerProcess, folder: Path) -> None:
    """On a pool of two, three episodes in a row: each finds no file and no global left by the ones before."""
    row = rows(folder)[0]
    found: list[Any] = []
    for _ in range(3):
        pool_is_whole(server)
        async with EpisodeClient(server.url) as episode:
            await episode.seed(row)
            found.append(json.loads((await episode.call_tool("leave", {})).text))
            await episode.verify(row)
    assert found == [{"file": False, "global": None}] * 3, found
