"""A restart never scores a lost episode: whatever the server signs with, the cookie of an episode seeded before a
restart is answered as lost (410, ``session_lost``) after it, on a Gym server that keeps state per session and on a
written one; never played on or graded as a new episode.

Without ``GYMHOST_SECRET`` the server keeps the secret it made in the user's state directory, and a restart finds it;
where that cannot be written, it signs with a secret of its start alone, says so, and a cookie of another start is
still answered as lost. (With ``GYMHOST_SECRET`` set: ``test_operating``.)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gymhost import EpisodeClient
from gymhost.environments import write_folder

from .agentenv_helpers import COUNTER_TASK, make_bundle, rows
from .gym_plays import example_rows, play_session_state
from .processes import CALL_TIMEOUT_S, ServerProcess, gymhost_command, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

STATEFUL = "example_session_state_mgmt"
Served = tuple[Path, dict[str, Any], str, dict[str, Any]]  # a folder, a row, a tool and its arguments


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("restarts")
    return write_folder(str(make_bundle(root, tasks=[COUNTER_TASK])), root / "root", instances="1:2").path


@pytest.fixture(params=["gym", "written"])
def server(request: pytest.FixtureRequest, gym_root: Path, written: Path) -> Served:
    if request.param == "gym":
        folder = gym_root / STATEFUL
        return folder, example_rows(folder)[0], "increment_counter", {"count": 1}
    return written, rows(written)[0], "increment", {"by": 1}


@contextmanager
def serve(folder: Path, state: Path) -> Iterator[ServerProcess]:
    environment = {"XDG_STATE_HOME": str(state), "GYMHOST_SECRET": ""}
    with serving(gymhost_command("serve", str(folder), "--port", "0"), env=environment) as process:
        yield process


def assert_lost(answer: httpx.Response) -> None:
    assert answer.status_code == 410, answer.text
    assert answer.json()["failure_kind"] == "session_lost", answer.text


def lost_requests(url: str) -> dict[str, float]:
    """``gymhost_lost_session_requests_total`` by ``why``."""
    exposition = httpx.get(f"{url}/metrics", timeout=CALL_TIMEOUT_S).text
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "gymhost_lost_session_requests_total":
                counted[sample.labels["why"]] = counted.get(sample.labels["why"], 0.0) + sample.value
    return counted


async def restart_and_play(
    folder: Path, row: dict[str, Any], tool: str, arguments: dict[str, Any], state: Path, why: str
) -> str:
    """Seed and play a call, restart, then try the episode's next call and its verify: both answered as lost,
    counted under ``why`` and logged; on a written server whose kept secret a restart finds, a seed on the episode's
    cookie too (the model's own call, through Gym's agents, would start its lost episode over). The second start's
    output."""
    lost = 3 if why == "owner_gone" and folder.name != STATEFUL else 2
    with serve(folder, state) as first:
        episode = EpisodeClient(first.url)
        await episode.seed(row)
        assert (await episode.call_tool(tool, arguments)).ok
    with serve(folder, state) as second:
        episode.base_url = second.url
        assert_lost(await episode.post(f"/{tool}", arguments))
        assert_lost(await episode.post("/verify", {**row, "response": episode.transcript.response("done")}))
        if lost == 3:
            assert_lost(await episode.post("/seed_session", row))
        assert lost_requests(second.url) == {"owner_gone": 0.0, "another_secret": 0.0, why: float(lost)}  # from 0
        if folder.name == STATEFUL:  # a new episode plays there as on any start
            assert (await play_session_state(second.url, row, True))["reward"] == 1.0
        else:
            async with EpisodeClient(second.url) as fresh:
                await fresh.seed(row)
                assert (await fresh.call_tool(tool, {"by": 2})).ok
                assert (await fresh.verify(row))["reward"] == 1.0
        output = second.output
    assert output.count("answered as a lost session") == lost, output
    return output


async def test_a_restart_finds_the_kept_secret_and_answers_the_episode_as_lost(server: Served, tmp_path: Path) -> None:
    folder, row, tool, arguments = server
    output = await restart_and_play(folder, row, tool, arguments, tmp_path / "state", "owner_gone")
    kept = tmp_path / "state" / "gymhost" / "secret"
    assert f"sessions are signed with the secret kept in {kept}" in output
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700


async def test_a_secret_of_one_start_alone_is_said_and_its_episodes_are_lost_after_a_restart(
    server: Served, tmp_path: Path
) -> None:
    folder, row, tool, arguments = server
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("a file where the state directory would be")
    output = await restart_and_play(folder, row, tool, arguments, not_a_folder, "another_secret")
    assert "WARNING: sessions are signed with a secret of this start alone" in output
    assert "a restart answers every open episode as lost; set GYMHOST_SECRET" in output


def test_a_kept_secret_another_user_can_read_is_not_used(gym_root: Path, tmp_path: Path) -> None:
    kept = tmp_path / "state" / "gymhost" / "secret"
    kept.parent.mkdir(parents=True)
    kept.write_text("everyone-can-read-this\n")
    os.chmod(kept, 0o644)
    with serve(gym_root / "example_single_tool_call", tmp_path / "state") as process:
        assert httpx.get(f"{process.url}/readyz", timeout=CALL_TIMEOUT_S).status_code == 200
        output = process.output
    assert f"{kept} could not be kept: another user may read or change it (mode -rw-r--r--)" in output
