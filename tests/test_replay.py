"""Gym's own recorded rollouts, replayed through gymhost: the rewards Gym's servers gave, given again.

Every resources server nemo-gym publishes ships ``data/example_rollouts.jsonl``, rows Gym itself played. This tier
replays them (``replay_helpers``) for every published folder that can be played offline, and holds each reward to the
recorded one. ``tests/replay/nemo_gym_<version>.json`` says what each folder needs:

- ``as_installed``: it plays in the environment gymhost runs in: built with ``create_app`` and replayed in-process;
- ``own_venv``: its ``requirements.txt`` names packages this environment lacks: ``gymhost serve FOLDER --venv``
  builds it a venv of its own (with uv, as Gym does) and serves it from there, a real process replayed over HTTP;
- the others, with why, are not replayed: they need a model server (a judge, a policy), a sandbox or the network, a
  deployment's values (keys, ``env.yaml``), or have no recording to replay.

A row that differs from its recording is either listed there with the reason (an environment random by design, a
verifier changed since the recording, a recording that lost a turn), and for those that are deterministic Gym's own
launcher (``python app.py`` with the config in ``NEMO_GYM_CONFIG_DICT``) answers the same replay the same way, or it
is a defect. Replays run from a writable copy of the installed Gym root, since some servers write into their folder.
The README's table of what the folders need is this tier's (``test_the_readme_table_is_the_manifests``).

Run with ``GYMHOST_REPLAY_SET=image`` (``make test-replay-image``), the folders as installed are replayed in a venv
of the image's set: nemo-gym without its dependencies, beside the requirements serving imports
(``deploy/container/serving_requirements.py``). Each plays as in the full install, or, listed with ``image_lacks``,
fails to build naming what the image leaves out; Gym's own launcher, which needs Hydra and Ray, is compared in the
full install's run only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import FolderError, create_app
from gymhost._hosting._lifespan import running_lifespan

from .conftest import REPO
from .processes import (
    CALL_TIMEOUT_S,
    alive,
    assert_stopped_cleanly,
    children,
    free_port,
    gymhost_command,
    serving,
    with_read_only,
)
from .replay_helpers import InputRows, Replayed, plays_gymnasium, replay_gymnasium, replay_simple, rollouts

pytestmark = [pytest.mark.nemo_gym, pytest.mark.replay, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

ROWS = 5  # of each folder's recording
# A replayed call's limit: a hang is caught, never a slow machine. A folder's first verify may import its grader's
# whole stack (compiling a fresh venv's bytecode), which took over 60 s on two cores shared with other work.
REQUEST_TIMEOUT_S = 600
NEEDS = {
    "as_installed": "as installed",
    "own_venv": "their requirements (a venv of their own)",
    "model_server": "a model server (a judge, a policy)",
    "sandbox_or_network": "a sandbox or the network",
    "deployment_values": "a deployment's values (keys, env.yaml)",
    "no_recording": "no recording to replay",
    "other": "other (not a server; data or a package the folder does not ship or name)",
}


def _manifest() -> dict[str, dict[str, Any]]:
    """The manifest of the installed nemo-gym's folders (none where nemo-gym is not installed: the unit tier)."""
    try:
        installed = version("nemo-gym")
    except PackageNotFoundError:
        return {}
    manifest: dict[str, dict[str, Any]] = json.loads(
        (REPO / "tests" / "replay" / f"nemo_gym_{installed}.json").read_text()
    )
    return manifest


MANIFEST = _manifest()
IMAGE_SET = os.environ.get("GYMHOST_REPLAY_SET") == "image"


def folders(*needs: str) -> list[str]:
    return sorted(name for name, entry in MANIFEST.items() if entry["needs"] in needs)


@pytest.fixture(scope="module")
def gym_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A writable copy of the Gym root the installed nemo-gym ships."""
    import resources_servers

    installed = Path(next(iter(resources_servers.__path__)))
    root = tmp_path_factory.mktemp("gym-root")
    shutil.copytree(installed, root / "resources_servers", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Where the folders' own venvs are built, and uv on PATH to build them (make test installs it)."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.fail("uv must be installed in the tier's venv (make test installs it): it builds the folders' venvs")
    cache = Path(os.environ.get("GYMHOST_VENV_DIR") or tmp_path_factory.mktemp("venvs"))
    return {"GYMHOST_VENV_DIR": str(cache), "PATH": f"{Path(uv).parent}{os.pathsep}{os.environ['PATH']}"}


async def replay(
    client: Callable[[], httpx.AsyncClient], folder: Path, gymnasium: bool, verifier_fields: set[str]
) -> list[Replayed]:
    """Every recorded rollout, each as a new episode: a client of its own, with an empty cookie jar."""
    rows = InputRows(folder, verifier_fields)
    played = []
    for position, rollout in enumerate(rollouts(folder, ROWS)):
        async with client() as episode:
            play = replay_gymnasium if gymnasium else replay_simple
            played.append(await play(episode, rollout, rows.of(rollout), position))
    return played


def hold_to_recording(name: str, played: list[Replayed]) -> None:
    entry = MANIFEST[name]
    assert played, f"{name}: no recorded rollout to replay"
    if "nondeterministic" in entry:  # it must still play to an end and give a reward
        assert all(row.reward is not None for row in played), "\n".join(map(str, played))
        return
    known = entry.get("differs", {})
    wrong = [row for row in played if not row.equal and str(row.position) not in known]
    assert not wrong, f"{name}: rewards that differ from Gym's recording:\n" + "\n".join(map(str, wrong))
    stale = [position for position in known if int(position) < len(played) and played[int(position)].equal]
    assert not stale, f"{name}: rows listed as differing replay right now: {stale}; update the manifest"


@pytest.mark.parametrize("name", folders("as_installed"))
async def test_a_folder_as_installed_replays_its_recorded_rewards(name: str, gym_root: Path) -> None:
    folder = gym_root / "resources_servers" / name
    if IMAGE_SET and "image_lacks" in MANIFEST[name]:
        with pytest.raises(FolderError, match=f"No module named '{MANIFEST[name]['image_lacks']}'"):
            create_app(folder, **MANIFEST[name].get("set", {}))
        return
    app = create_app(folder, **MANIFEST[name].get("set", {}))
    paths = {
        getattr(route, "path", "") for route in app.router.routes if "POST" in (getattr(route, "methods", None) or ())
    }
    async with running_lifespan(app):
        transport = httpx.ASGITransport(app=app)

        def client() -> httpx.AsyncClient:
            return httpx.AsyncClient(transport=transport, base_url="http://gym.replay", timeout=REQUEST_TIMEOUT_S)

        played = await replay(client, folder, plays_gymnasium(paths), _verifier_fields(app))
    hold_to_recording(name, played)
    if MANIFEST[name].get("gym_launcher") and not IMAGE_SET:
        assert [row.reward for row in played] == [row.reward for row in await under_gym_launcher(folder)], (
            f"{name}: Gym's own launcher answers the replay differently from gymhost"
        )


@pytest.mark.parametrize("name", folders("own_venv"))
async def test_a_folder_in_its_own_venv_replays_its_recorded_rewards(
    name: str, gym_root: Path, venvs: dict[str, str]
) -> None:
    """``gymhost serve FOLDER --venv``: the venv built from its requirements.txt (or reused), the server a process
    of its own, replayed over HTTP with a client that keeps every cookie, as Gym's agents do."""
    folder = gym_root / "resources_servers" / name
    with serving(served_with_venv(folder), env={**venvs, **time_limits(name)}) as server:
        played = await replay_over_http(server.url, folder)
    assert "building it a venv of its own" in server.output or "serving from its own venv" in server.output, (
        server.output
    )
    hold_to_recording(name, played)


async def test_a_venv_built_ahead_serves_on_a_read_only_file_system(gym_root: Path, venvs: dict[str, str]) -> None:
    """A pod whose root file system is read-only, its folder's venv built ahead (a layer of its image, a volume):
    ``serve --venv`` serves from that venv and plays as it recorded, writing nothing there (no lock to take)."""
    name = folders("own_venv")[0]
    folder = gym_root / "resources_servers" / name
    command = served_with_venv(folder)
    with serving(command, env={**venvs, **time_limits(name)}):  # built ahead (or by the replay above)
        pass
    built = Path(venvs["GYMHOST_VENV_DIR"])
    with serving(with_read_only(built, command), env={**venvs, **time_limits(name)}) as server:
        assert _command_line(server.process.pid).startswith(f"{built}/{name}-"), "not served from its venv"
        played = await replay_over_http(server.url, folder)
    assert "Read-only file system" not in server.output, server.output
    hold_to_recording(name, played)


def served_with_venv(folder: Path) -> list[str]:
    """``gymhost serve FOLDER --venv``, with the manifest's settings for it."""
    settings = [f"--set={key}={value}" for key, value in MANIFEST[folder.name].get("set", {}).items()]
    return gymhost_command("serve", str(folder), "--port", "0", "--venv", *settings)


async def replay_over_http(url: str, folder: Path) -> list[Replayed]:
    """``folder``'s recorded rollouts replayed against the server at ``url``, each with a client of its own."""
    openapi = httpx.get(f"{url}/openapi.json", timeout=CALL_TIMEOUT_S).json()
    return await replay(
        lambda: httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S),
        folder,
        plays_gymnasium(set(openapi["paths"])),
        _fields_added(openapi),
    )


async def test_a_root_serves_the_folders_that_need_their_own_venv_by_processes_behind_one_address(
    gym_root: Path, venvs: dict[str, str], tmp_path: Path
) -> None:
    """``gymhost serve ROOT --venv``: a folder this environment meets is served in the gateway's process, one it does
    not from its venv by a process of its own at its prefix; both replay right through the one address, the
    gateway's readiness and metrics cover both, and a SIGTERM stops both."""
    root = tmp_path / "root"
    for name in ("example_single_tool_call", "math_with_judge"):
        shutil.copytree(gym_root / "resources_servers" / name, root / "resources_servers" / name)
    # A root's folders take no --set: the manifest's values go in the root's env.yaml, as a deployment's would.
    values = {name: {"resources_servers": {name: MANIFEST[name]["set"]}} for name in ["math_with_judge"]}
    (root / "env.yaml").write_text(json.dumps(values))  # YAML reads JSON
    command = gymhost_command("serve", str(root), "--port", "0", "--venv")
    with serving(command, env={**venvs, **time_limits("math_with_judge")}) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=CALL_TIMEOUT_S).json() == {"status": "ok"}
        (mount,) = [pid for pid in children(server.process.pid) if "math_with_judge" in _command_line(pid)]
        for name in ("example_single_tool_call", "math_with_judge"):
            base = f"{server.url}/{name}"
            openapi = httpx.get(f"{base}/openapi.json", timeout=CALL_TIMEOUT_S).json()
            played = await replay(
                lambda base=base: httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT_S),  # type: ignore[misc]
                root / "resources_servers" / name,
                False,
                _fields_added(openapi),
            )
            hold_to_recording(name, played)
        metrics = httpx.get(f"{server.url}/metrics", timeout=CALL_TIMEOUT_S).text
        for name in ("example_single_tool_call", "math_with_judge"):
            assert f'gymhost_sessions_started_total{{mount="/{name}"}} {float(ROWS)}' in metrics, metrics
    assert_stopped_cleanly(server)
    assert not alive(mount), "the folder's process outlived the gateway"


def time_limits(name: str) -> dict[str, str]:
    """The environment that raises a verifier's own time limit where the manifest says it must, and why
    (``tests/replay/time_limits``)."""
    limit = MANIFEST[name].get("verify_time_limit_s")
    if limit is None:
        return {}
    return {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "tests" / "replay" / "time_limits"), os.environ.get("PYTHONPATH")])
        ),
        "GYMHOST_REPLAY_MATH_VERIFY_TIMEOUT_S": str(limit),
    }


def _command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def test_the_docs_table_is_the_manifests() -> None:
    """The serving page's table of what Gym's published folders need, per version: this tier's manifests."""
    table = readme_table()
    page = (REPO / "docs" / "serving.md").read_text()
    assert table in page, f"docs/serving.md's table is out of date; it is now:\n{table}"


def readme_table() -> str:
    counts = {}
    for path in sorted((REPO / "tests" / "replay").glob("nemo_gym_*.json")):
        counts[path.stem.removeprefix("nemo_gym_")] = Counter(
            entry["needs"] for entry in json.loads(path.read_text()).values()
        )
    versions = sorted(counts, key=lambda v: tuple(int(part) for part in v.split(".")))
    lines = ["| what a folder needs | " + " | ".join(f"nemo-gym {v}" for v in versions) + " |"]
    lines.append("|---|" + "---|" * len(versions))
    for needs, label in NEEDS.items():
        lines.append(f"| {label} | " + " | ".join(str(counts[v][needs]) for v in versions) + " |")
    lines.append("| **published folders** | " + " | ".join(str(sum(counts[v].values())) for v in versions) + " |")
    return "\n".join(lines)


def _fields_added(openapi: dict[str, Any]) -> set[str]:
    """``_verifier_fields``, read from a served app's OpenAPI document."""
    verify = openapi["paths"].get("/verify", {}).get("post", {})
    schemas = openapi.get("components", {}).get("schemas", {})

    def fields(schema: dict[str, Any]) -> set[str]:
        name = str(schema.get("$ref", "")).rsplit("/", 1)[-1]
        return set(schemas.get(name, schema).get("properties", {}))

    request = verify.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    response = (
        verify.get("responses", {}).get("200", {}).get("content", {}).get("application/json", {}).get("schema", {})
    )
    return fields(response) - fields(request)


def _verifier_fields(app: Any) -> set[str]:
    """The fields a server's verify answer adds to its request: not part of the row Gym sent."""
    import typing

    server = app.state.gymhost.server
    try:
        hints = typing.get_type_hints(type(server).verify)
    except Exception:
        return set()
    request, response = hints.get("body"), hints.get("return")
    return set(getattr(response, "model_fields", {})) - set(getattr(request, "model_fields", {}))


async def under_gym_launcher(folder: Path) -> list[Replayed]:
    """The same replay against Gym's own server for the folder: ``python app.py`` in its folder, with the config in
    ``NEMO_GYM_CONFIG_DICT``, as ``gym env start`` runs it once its venv exists."""
    from omegaconf import OmegaConf

    from gymhost._hosting._folder import load_server_spec

    spec = load_server_spec(folder)
    port = free_port()
    config = OmegaConf.to_container(OmegaConf.load(spec.config_file))
    assert isinstance(config, dict)
    config[spec.config_key]["resources_servers"][spec.implementation].update(host="127.0.0.1", port=port)
    global_config = {**config, "head_server": {"host": "127.0.0.1", "port": free_port()}, "dry_run": False}
    env = {
        "NEMO_GYM_CONFIG_DICT": OmegaConf.to_yaml(OmegaConf.create(global_config)),
        "NEMO_GYM_CONFIG_PATH": spec.config_key,
    }
    url = f"http://127.0.0.1:{port}"
    with serving([sys.executable, spec.block["entrypoint"]], cwd=folder, env=env, url=url):
        return await replay_over_http(url, folder)
