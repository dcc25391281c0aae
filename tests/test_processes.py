"""The example servers as real processes: `gymhost serve` under uvicorn and hypercorn, and `asgi:app` run by
uvicorn's and hypercorn's own command lines. Each plays rows over TCP and stops cleanly on SIGTERM."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from .conftest import REPO
from .gym_plays import PLAYS, example_rows, expected_reward
from .processes import assert_stopped_cleanly, free_port, gymhost_command, run_to_completion, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]


async def _play_rows(url: str, example: str, folder: Path, gym_version: tuple[int, ...]) -> None:
    rows = example_rows(folder)[:2]
    for right in (True, False):
        for row in rows:
            answer = await PLAYS[example](url, row, right, None)
            assert answer["reward"] == expected_reward(example, right, gym_version)


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_gymhost_serve_plays_rows(gym_root: Path, gym_version: tuple[int, ...], server: str) -> None:
    folder = gym_root / "example_session_state_mgmt"
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--server", server)) as process:
        assert process.url.startswith("http://127.0.0.1:")
        await _play_rows(process.url, "example_session_state_mgmt", folder, gym_version)
    assert_stopped_cleanly(process)
    if server == "uvicorn":
        assert "Application shutdown complete." in process.output


async def test_serve_dot_from_inside_the_folder(gym_root: Path, gym_version: tuple[int, ...], tmp_path: Path) -> None:
    """`python -m gymhost serve .` in a copy of the folder that is not inside any Gym root."""
    folder = shutil.copytree(gym_root / "example_single_tool_call", tmp_path / "example_single_tool_call")
    with serving(gymhost_command("serve", ".", "--port", "0"), cwd=folder) as process:
        await _play_rows(process.url, "example_single_tool_call", folder, gym_version)
    assert "gymhost: serving example_single_tool_call at http://127.0.0.1:" in process.output


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_mcp_through_a_real_server(gym_root: Path, gym_version: tuple[int, ...], server: str) -> None:
    folder = gym_root / "example_mcp_weather"
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--server", server)) as process:
        await _play_rows(process.url, "example_mcp_weather", folder, gym_version)


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "uvicorn", "asgi:app", "--host", "127.0.0.1", "--port", "{port}"],
        [sys.executable, "-m", "hypercorn", "asgi:app", "--bind", "127.0.0.1:{port}"],
    ],
    ids=["uvicorn", "hypercorn"],
)
async def test_asgi_module_under_the_servers_own_command_line(
    gym_root: Path, gym_version: tuple[int, ...], command: list[str]
) -> None:
    folder = gym_root / "example_single_tool_call"
    port = free_port()
    argv = [part.format(port=port) for part in command]
    url = f"http://127.0.0.1:{port}"
    with serving(argv, cwd=REPO, env={"GYMHOST_FOLDER": str(folder)}, url=url):
        await _play_rows(url, "example_single_tool_call", folder, gym_version)


@pytest.mark.parametrize(
    ("command", "environ"),
    [
        ([sys.executable, "-m", "uvicorn", "asgi:app", "--port", "{port}", "--workers", "2"], {}),
        ([sys.executable, "-m", "uvicorn", "asgi:app", "--port", "{port}"], {"UVICORN_WORKERS": "2"}),
        ([sys.executable, "-m", "hypercorn", "asgi:app", "--bind", "127.0.0.1:{port}", "--workers", "2"], {}),
        (["{bin}/gunicorn", "-k", "uvicorn.workers.UvicornWorker", "-w2", "-b", "127.0.0.1:{port}", "asgi:app"], {}),
    ],
    ids=["uvicorn", "uvicorn-environment", "hypercorn", "gunicorn"],
)
def test_another_servers_workers_refuse_to_start_naming_gymhost_serve_workers(
    gym_root: Path, command: list[str], environ: dict[str, str]
) -> None:
    """Their workers share one socket with no regard for which holds an episode, so they would lose episodes: the
    server stops at start (the workers exit as workers that can never start), saying what works instead."""
    argv = [part.format(port=free_port(), bin=Path(sys.executable).parent) for part in command]
    folder = gym_root / "example_single_tool_call"
    # It stops by itself (uvicorn and hypercorn then exit 0, gunicorn 3): run_to_completion returns.
    result = run_to_completion(argv, cwd=REPO, env={"GYMHOST_FOLDER": str(folder), **environ}, timeout=120)
    assert "gymhost: " in result.stderr, result.stderr
    assert "runs 2 workers of this app" in result.stderr, result.stderr
    assert "gymhost serve --workers 2" in result.stderr, result.stderr


def test_asgi_module_with_a_wrong_folder_exits_with_one_line(tmp_path: Path) -> None:
    result = run_to_completion(
        [sys.executable, "-c", "import os; os.environ['GYMHOST_FOLDER'] = 'no/such/folder'; import asgi"], cwd=REPO
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "gymhost: GYMHOST_FOLDER=no/such/folder: no/such/folder: no such folder; "
        "expected a resources-server folder with app.py and configs/"
    )


def test_asgi_module_with_a_path_with_a_space_says_gymhost_folder_is_split(tmp_path: Path) -> None:
    spaced = tmp_path / "My Projects" / "server"
    code = f"import os; os.environ['GYMHOST_FOLDER'] = {str(spaced)!r}; import asgi"
    result = run_to_completion([sys.executable, "-c", code], cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"gymhost: GYMHOST_FOLDER={tmp_path / 'My'} Projects/server: ")
    assert result.stderr.strip().endswith(
        "(GYMHOST_FOLDER is split on spaces: a path with a space in it cannot be given there)"
    )


def test_a_busy_port_is_one_clear_line(gym_root: Path) -> None:
    folder = gym_root / "example_single_tool_call"
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as first:
        port = first.url.rsplit(":", 1)[1]
        result = run_to_completion(gymhost_command("serve", str(folder), "--port", port))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: 127.0.0.1:{port} is already in use; choose another --port (0 picks a free one)"
    )
    assert "Traceback" not in result.stderr


def test_a_bad_folder_is_one_clear_line(tmp_path: Path) -> None:
    result = run_to_completion(gymhost_command("serve", str(tmp_path), "--port", "0"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {tmp_path / 'configs'}: no configs/*.yaml; expected configs/{tmp_path.name}.yaml "
        "holding the server's 'resources_servers' block"
    )
    assert "Traceback" not in result.stderr
