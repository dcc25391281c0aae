"""The documentation's commands and examples work as written: the README's quickstart (served, played with curl and
with EpisodeClient, an environment written and served), and the Python examples of the pages (with their paths
pointed at the installed examples)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .conftest import REPO
from .processes import CALL_TIMEOUT_S, free_port, gymhost_command, run_to_completion, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.usefixtures("clean_env")]

QUICKSTART = REPO / "docs" / "_quickstart.md"


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.DOTALL)


def python_blocks() -> list[str]:
    return blocks(REPO / "docs" / "asgi.md", "python")


def test_the_readme_is_short_and_starts_with_the_quickstart() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.startswith(QUICKSTART.read_text()), "README.md begins with docs/_quickstart.md, verbatim"
    assert (REPO / "docs" / "index.md").read_text().startswith(QUICKSTART.read_text())
    assert readme.splitlines().index("## Quickstart") < 80
    assert len(readme.split()) < 2500


@pytest.mark.processes
def test_the_quickstart_plays_an_episode_with_curl_and_with_episode_client(tmp_path: Path) -> None:
    """The quickstart's commands, in order, with a free port for 8000 and 8001."""
    serve_block, curl_block, write_block = blocks(QUICKSTART, "bash")
    (python_block,) = blocks(QUICKSTART, "python")
    listed = run_to_completion(gymhost_command("list"))
    assert serve_block.splitlines()[0].startswith("gymhost list")
    assert listed.returncode == 0, listed.stderr
    assert "example_single_tool_call " in listed.stdout, listed.stdout
    port = str(free_port())
    command = serve_block.splitlines()[1].split()
    assert command == ["gymhost", "serve", "example_single_tool_call", "--port", "8000"]
    with serving(gymhost_command(*command[1:-1], port)):
        played = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", curl_block.replace("localhost:8000", f"localhost:{port}")],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert played.returncode == 0, played.stderr
        assert '"reward":1.0' in played.stdout.rsplit('"response":', 1)[-1], played.stdout
        script = tmp_path / "quickstart.py"
        script.write_text(python_block.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
        result = run_to_completion([sys.executable, str(script)])
        assert (result.returncode, result.stdout.strip()) == (0, "1.0"), result.stderr
    write, serve = write_block.strip().splitlines()
    assert write.split()[:3] == ["gymhost", "write", "examples/gridsim_v1"]
    example = str(REPO / "examples" / "gridsim_v1")  # the command is run from a checkout's root
    written = run_to_completion(gymhost_command("write", example, *write.split()[3:]), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    port = str(free_port())
    with serving(gymhost_command(*serve.split()[1:-1], port), cwd=tmp_path) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).json() == {"status": "ok"}


def test_the_episode_by_hand_of_a_written_server_scores_one(tmp_path: Path) -> None:
    """docs/environments.md's curl episode on the quickstart's gridsim folder: its block, run as written."""
    (block,) = [b for b in blocks(REPO / "docs" / "environments.md", "bash") if "/seed_session" in b]
    example = str(REPO / "examples" / "gridsim_v1")
    written = run_to_completion(gymhost_command("write", example, "my_envs"), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    port = str(free_port())
    with serving(gymhost_command("serve", "my_envs/resources_servers/gridsim_v1", "--port", port), cwd=tmp_path):
        played = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.replace("localhost:8001", f"localhost:{port}")],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
    assert played.returncode == 0, played.stderr
    answers, decoder, text = [], json.JSONDecoder(), played.stdout.strip()
    while text:  # each curl's answer, one JSON value after another
        value, end = decoder.raw_decode(text)
        answers.append(value)
        text = text[end:].lstrip()
    _seeded, looked, *moves, verdict = answers
    assert looked["pos"] == [0, 0]
    assert moves[-1]["pos"] == [3, 0]
    assert verdict["reward"] == 1.0, verdict


def test_the_gateway_example_plays_a_session_on_each_mount(tmp_path: Path) -> None:
    """docs/gateways.md's example, run as written (its port a free one): both mounts listed, each session kept."""
    (block,) = blocks(REPO / "docs" / "gateways.md", "bash")
    serve, *curls = block.strip().splitlines()
    command = serve.split()
    assert command == ["gymhost", "serve", "example_single_tool_call", "example_session_state_mgmt", "--port", "8002",
                       "&"]  # fmt: skip
    port = str(free_port())
    with serving(gymhost_command(*command[1:-2], port)):
        played = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", "\n".join(curls).replace("8002", port)],
            cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    assert played.returncode == 0, played.stderr
    answers, decoder, text = [], json.JSONDecoder(), played.stdout.strip()
    while text:
        value, end = decoder.raw_decode(text)
        answers.append(value)
        text = text[end:].lstrip()
    ready, listed, *_, counted = answers
    assert ready == {"status": "ok"}
    prefixes = sorted(server["prefix"] for server in listed["servers"])
    assert prefixes == ["/example_session_state_mgmt", "/example_single_tool_call"]
    assert counted == {"count": 4}


def test_the_create_app_example_prints_reward_one(gym_root: Path, tmp_path: Path) -> None:
    (block,) = [b for b in python_blocks() if "create_app(folder)" in b]
    placeholder = "path/to/resources_servers/example_session_state_mgmt"
    assert placeholder in block
    script = tmp_path / "readme_example.py"
    script.write_text(block.replace(placeholder, str(gym_root / "example_session_state_mgmt")))
    result = run_to_completion([sys.executable, str(script)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1.0"


MOUNT_CHECK = """

import asyncio as _asyncio

import httpx as _httpx


async def _check() -> None:
    async with app.router.lifespan_context(app):
        async with _httpx.AsyncClient(transport=_httpx.ASGITransport(app=app), base_url="http://t") as client:
            for prefix in PREFIXES:
                print(prefix, (await client.get(prefix + "/")).json())


_asyncio.run(_check())
"""


@pytest.mark.parametrize(
    ("marker", "prefixes"),
    [("mounted_lifespan)", ["/gridsim", "/counter"]), ("create_gateway({", ["/gridsim", "/weather"])],
)
def test_the_mounting_examples_serve_every_mount(
    gym_root: Path, tmp_path: Path, marker: str, prefixes: list[str]
) -> None:
    from gymhost.environments import write_folder

    (block,) = [b for b in python_blocks() if marker in b]
    written = write_folder(str(REPO / "examples" / "gridsim_v1"), tmp_path / "root").path
    script = block.replace("root/resources_servers/gridsim_v1", str(written))
    script = script.replace(
        "path/to/resources_servers/example_session_state_mgmt", str(gym_root / "example_session_state_mgmt")
    )
    script = script.replace("path/to/example_mcp_weather", str(gym_root / "example_mcp_weather"))
    assert '"path/to/' not in script
    assert '"root/resources_servers' not in script
    (tmp_path / "readme_mounts.py").write_text(script + f"\nPREFIXES = {prefixes!r}\n" + MOUNT_CHECK)
    result = run_to_completion([sys.executable, str(tmp_path / "readme_mounts.py")])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-len(prefixes) :] == [f"{p} {{'status': 'ok'}}" for p in prefixes]


def test_make_demo_plays_every_row_to_its_reference_reward() -> None:
    """The README's first command: the demo writes, serves and plays gridsim, and says every row scored 1.00 (it
    once stopped at the server's first line, when that line became the open-files notice)."""
    result = run_to_completion([sys.executable, str(REPO / "examples" / "demo.py")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mean reward: 1.00 following the reference solutions; masked samples: 0" in result.stdout
