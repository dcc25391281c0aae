"""What a newcomer gives `gymhost serve`: installed Gym servers by name, several at once, some of a root, and the
mistakes they make on the way, each answered with one line that names the fix before anything slow happens."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import create_app, create_gateway, mounted_lifespan

from .agentenv_helpers import GRIDSIM, rows
from .gym_plays import example_rows, play_session_state
from .processes import (
    CALL_TIMEOUT_S,
    gymhost_command,
    on_a_terminal,
    run_to_completion,
    serving,
    with_read_only,
)

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

WEATHER, COUNTER = "example_single_tool_call", "example_session_state_mgmt"
UNMET = "asr_with_pc"  # its requirements.txt names jiwer, which the tiers' venvs do not have


def one_error_line(*args: str) -> str:
    done = run_to_completion(gymhost_command(*args))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "", done.stdout
    (line,) = done.stderr.strip().splitlines()
    return line


@pytest.mark.processes
async def test_installed_servers_are_served_by_name_alone_or_several_at_once(gym_root: Path) -> None:
    with serving(gymhost_command("serve", COUNTER, "--port", "0")) as alone:
        assert f"gymhost: serving {COUNTER} at {alone.url}" in alone.output
        assert (await play_session_state(alone.url, example_rows(gym_root / COUNTER)[0], True))["reward"] == 1.0
    with serving(gymhost_command("serve", WEATHER, COUNTER, "--port", "0")) as both:
        listed = {server["prefix"]: server for server in httpx.get(both.url, timeout=CALL_TIMEOUT_S).json()["servers"]}
        assert sorted(listed) == [f"/{COUNTER}", f"/{WEATHER}"]
        assert listed[f"/{WEATHER}"]["tools"] == ["get_weather"]
        row = example_rows(gym_root / COUNTER)[0]
        assert (await play_session_state(f"{both.url}/{COUNTER}", row, True))["reward"] == 1.0
        # Many servers take a while to build and start: each is said as it is done, and the slowest at the end.
        for what in ("built", "started"):
            assert f"gymhost: {what} /{WEATHER}, 1 of 2, in " in both.output, both.output
            assert f"gymhost: {what} /{COUNTER}, 2 of 2, in " in both.output
            assert f"gymhost: {what} 2 servers in " in both.output


@pytest.mark.processes
def test_a_root_serves_only_the_servers_named(gym_root: Path, tmp_path: Path) -> None:
    for name in (WEATHER, COUNTER, "example_multi_step"):
        shutil.copytree(gym_root / name, tmp_path / "resources_servers" / name)
    with serving(gymhost_command("serve", str(tmp_path), "--only", f"{WEATHER},{COUNTER}", "--port", "0")) as server:
        listed = [entry["prefix"] for entry in httpx.get(server.url, timeout=CALL_TIMEOUT_S).json()["servers"]]
    assert listed == [f"/{WEATHER}", f"/{COUNTER}"]
    line = one_error_line("serve", str(tmp_path), "--only", "nope")
    assert line.startswith(f"Error: --only nope: not in {tmp_path / 'resources_servers'} (it has: ")


def test_mistakes_are_one_line_naming_the_fix(gym_root: Path, tmp_path: Path) -> None:
    assert one_error_line("serve", "example_single_tol") == (
        "Error: example_single_tol: no such folder, and nemo-gym "
        f"{version()} ships no server of that name ({len(folders(gym_root))} do: gymhost list); did you mean "
        f"{WEATHER} or {COUNTER}?"
    )
    assert one_error_line("serve", str(gym_root)) == (
        f"Error: {gym_root}: this folder holds the Gym servers nemo-gym installed, not one server: name the ones "
        "to serve (gymhost serve NAME [NAME ...]; gymhost list shows them)"
    )
    assert one_error_line("serve", str(tmp_path / "missing")) == (
        f"Error: {tmp_path / 'missing'}: no such folder; expected a resources-server folder with app.py and configs/"
    )
    line = one_error_line("serve", UNMET)
    fix = "serve it with gymhost serve --venv (a venv of its own, built once, as Gym builds one), or install them here"
    assert line.startswith(f"Error: {UNMET}: its requirements.txt is not met here (jiwer"), line
    assert f"{fix} (gymhost requirements {gym_root / UNMET} lists them for pip install -r)" in line, line


def test_a_venv_build_that_fails_says_where_its_output_is_and_how_to_run_it_again(
    gym_root: Path, tmp_path: Path
) -> None:
    """``serve --venv`` of a folder whose requirements.txt names what no index has: the start says where the
    installer's output goes; the failure is one line with the output's end, that file, and the command to rerun."""
    import sys

    folder = Path(shutil.copytree(gym_root / WEATHER, tmp_path / "weather"))
    (folder / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\nsurely-no-such-package-anywhere==0.0.1\n")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv is not None, "uv must be installed in the tier's venv (make test installs it)"
    venvs = tmp_path / "venvs"
    env = {"GYMHOST_VENV_DIR": str(venvs), "PATH": f"{Path(uv).parent}:/usr/bin:/bin"}
    done = run_to_completion(gymhost_command("serve", str(folder), "--venv", "--port", "0"), env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    (log,) = venvs.glob(".weather-*.log")
    assert f"the installer's output goes to {log}" in done.stderr, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: building a folder's venv failed (installing its requirements): "), error
    assert "surely-no-such-package-anywhere" in error
    assert f"the installer's whole output is in {log}; to run it again: cd {folder} && {uv} pip install" in error
    assert "surely-no-such-package-anywhere" in log.read_text()
    (listed,) = venvs.glob(".weather-*.requirements.txt")  # what the command to run again reads
    assert str(listed) in error
    assert "surely-no-such-package-anywhere==0.0.1" in listed.read_text().splitlines()
    assert not list(venvs.glob("weather-*/bin/python")), "a failed build leaves no venv to be taken for a built one"
    shown = on_a_terminal(gymhost_command("serve", str(folder), "--venv", "--port", "0"), env=env, status=1)
    assert "weather: building its venv" in shown, shown  # a status line, redrawn in place
    assert "Error: building a folder's venv failed (installing its requirements): " in shown, shown


def test_a_venv_that_cannot_be_built_here_says_what_to_do_instead(gym_root: Path, tmp_path: Path) -> None:
    """``serve --venv`` where the venvs' folder is read-only (a pod's root file system) and holds no venv built
    ahead: one line naming the setting and the install to do instead, not a traceback."""
    venvs = tmp_path / "venvs"
    venvs.mkdir()
    command = with_read_only(venvs, gymhost_command("serve", UNMET, "--venv", "--port", "0"))
    done = run_to_completion(command, env={"GYMHOST_VENV_DIR": str(venvs)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: {UNMET}: its venv cannot be built in {venvs} (Read-only file system): set GYMHOST_VENV_DIR to a "
        "writable folder with room for it (up to 1.5 GB), or install what it needs in this environment instead: "
        f"gymhost requirements {gym_root / UNMET} | pip install -r /dev/stdin"
    )


def test_requirements_lists_what_to_install_for_pip(gym_root: Path) -> None:
    """What ``gymhost requirements`` prints is what pip installs: the unmet lines of each folder that has any, under a
    comment naming it; nothing for a folder whose requirements are met here."""
    done = run_to_completion(gymhost_command("requirements", UNMET, WEATHER))
    assert done.returncode == 0, done.stderr
    unmet = [line for line in (gym_root / UNMET / "requirements.txt").read_text().splitlines()[1:] if line]
    assert done.stdout.splitlines() == [f"# {UNMET} ({gym_root / UNMET})", *unmet]
    assert [line.split(">=")[0] for line in unmet] == ["jiwer", "whisper_normalizer"], unmet
    met = run_to_completion(gymhost_command("requirements", WEATHER))
    assert (met.returncode, met.stdout) == (0, "")


def test_a_busy_port_is_one_line_before_anything_is_built() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line("serve", WEATHER, "--port", str(port))
    assert line == f"Error: 127.0.0.1:{port} is already in use; choose another --port (0 picks a free one)"


def test_list_says_what_each_installed_server_needs_here() -> None:
    done = run_to_completion(gymhost_command("list"))
    assert done.returncode == 0, done.stderr
    where, header, *table, total = done.stdout.splitlines()
    assert where.startswith("Gym servers in "), "where they are, first"
    assert where.endswith("resources_servers:")
    assert header.split() == ["name", "requirements", "calls"]
    rows = {line.split()[0]: line.split(None, 1)[1] for line in table}
    assert rows[WEATHER].split() == ["met", "-"]
    assert rows[UNMET].startswith("--venv: jiwer"), rows[UNMET]
    assert rows["simpleqa"].split() == ["met", "genrm_model"]
    assert total.startswith(f"{len(rows)} servers; serve one with: gymhost serve NAME")


async def test_a_gateway_mounted_in_your_own_app_has_its_readiness_and_metrics_under_the_prefix(
    tmp_path: Path,
) -> None:
    """The existing-gateway pattern: your FastAPI app, with mounted_lifespan, mounts a gateway of written servers at
    /envs: /envs/readyz and /envs/metrics are theirs, and their metrics carry the whole prefix."""
    from fastapi import FastAPI

    from gymhost.environments import awrite_folder

    folder = (await awrite_folder(str(GRIDSIM), tmp_path)).path
    app = FastAPI(lifespan=mounted_lifespan)
    app.mount("/envs", create_gateway({"/gridsim": folder}))
    async with app.router.lifespan_context(app), client(app) as http:
        assert (await http.get("/envs/readyz")).json() == {"status": "ok"}
        metrics = (await http.get("/envs/metrics")).text
    assert 'gymhost_instances{mount="/envs/gridsim",state="free"}' in metrics, metrics


async def test_a_mount_whose_lifespan_never_ran_names_mounted_lifespan(tmp_path: Path) -> None:
    from fastapi import FastAPI

    from gymhost.environments import awrite_folder

    folder = (await awrite_folder(str(GRIDSIM), tmp_path)).path
    app = FastAPI()  # no mounted_lifespan: the mount's lifespan never runs
    app.mount("/gridsim", create_app(folder))
    row = rows(folder)[0]
    async with client(app) as http:
        seeded = await http.post("/gridsim/seed_session", json=row)
        ready = await http.get("/gridsim/readyz")
    assert seeded.status_code == 503
    assert "lifespan=gymhost.mounted_lifespan" in seeded.json()["detail"]
    assert ready.status_code == 503
    assert "lifespan=gymhost.mounted_lifespan" in ready.json()["reason"]


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mine.test")


def version() -> str:
    from importlib.metadata import version as installed

    return installed("nemo-gym")


def folders(gym_root: Path) -> list[str]:
    return [p.name for p in gym_root.iterdir() if (p / "configs").is_dir() and not p.name.startswith(".")]
