"""A Gym server's own process runs confined under ``--sandbox strict`` (issue 43, item 4): the server and the
children it starts on the model's text, as Gym's ``code_gen`` runs them ("no sandbox"), on a real ``gymhost serve``
against real namespaces (bubblewrap, as root: the hard case).

The model's code, run by the server's verify, tries what it should not reach: what only root may read, its own
server's folder and venv, its server's memory and environment, the secret gymhost keeps, its server's port and the
network, the host's processes. Confined, each is refused and the server still plays its episodes; served with
``--sandbox off``, the same code does each of them, so a refusal is the sandbox's doing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gymhost import EpisodeClient
from gymhost._metrics import _DECLARED
from gymhost.environments import awrite_folder

from .agentenv_helpers import make_bundle, rows
from .processes import STATE_TIMEOUT_S, alive, descendants, gymhost_command, run_to_completion, serving
from .test_confinement import VENV_PACKAGES, _an_address
from .test_folder_errors import CONFIG, make_folder
from .test_secrets_kept import RUNNER, SECRET, response_saying

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

# What the model's code tries, run by the server's verify; each value says what happened.
REACH = """\
import json, os, socket, uuid

def attempt(action):
    try:
        action()
        return "done"
    except OSError as error:
        return os.strerror(error.errno) if error.errno else repr(error)

def write_in(where):
    path = os.path.join(where, f"written-by-the-model-{uuid.uuid4().hex}")
    with open(path, "w") as file:
        file.write("the model wrote this")
    os.unlink(path)  # served unconfined, it leaves nothing behind

def connect(host, port):
    with socket.create_connection((host, port), timeout=5):
        pass

def read(path):
    with open(path, "rb") as file:
        return file.read()

def content(path):
    try:
        return read(path).decode()
    except OSError as error:
        return os.strerror(error.errno)

print(json.dumps({
    "uid": os.getuid(),
    "shadow": attempt(lambda: read("/etc/shadow")),
    "folder": attempt(lambda: write_in(FOLDER)),
    "venv": attempt(lambda: write_in(VENV)),
    "server memory": attempt(lambda: open(f"/proc/{os.getppid()}/mem", "rb").close()),  # opened: readable
    "server environment": attempt(lambda: read(f"/proc/{os.getppid()}/environ")),
    "kept secret": attempt(lambda: read(KEPT)),
    "sandbox's first process": attempt(lambda: read("/proc/1/environ")),
    "server": attempt(lambda: connect("127.0.0.1", PORT)),
    "outside": attempt(lambda: connect(OUTSIDE, 9)),
    "processes": sum(entry.isdigit() for entry in os.listdir("/proc")),
    "scratch": attempt(lambda: write_in("/tmp")),
    "rows": content(ROWS),
    "its own data": content(OWN_DATA),
}))
"""

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "reach"}]}}


# The trainer's rows, declared as Gym's configs declare them (in an agent's block, relative to the Gym root), and a
# file of the server's own beside them, which it may read (wordle reads its data/guesses.txt).
DATASETS = """\
runner_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      datasets:
      - name: train
        type: train
        jsonl_fpath: servers/runner/data/train.jsonl
"""
ROWS_TEXT = '{"hidden_tests": "the answers"}\n'


def runner_folder(tmp_path: Path) -> Path:
    config = CONFIG.format(key="runner", name="runner") + DATASETS
    folder = make_folder(tmp_path / "servers", name="runner", config=config, app=RUNNER)
    (folder / "data").mkdir()
    (folder / "data" / "train.jsonl").write_text(ROWS_TEXT)
    (folder / "data" / "guesses.txt").write_text("crane")
    return folder


async def reach_from_the_models_code(tmp_path: Path, *options: str) -> tuple[dict[str, Any], str]:
    """What the model's code, run by a served Gym server's verify, reports, and the server's output. No
    ``GYMHOST_SECRET``: the server keeps the secret it makes in a file, which the model's code tries to read."""
    folder = runner_folder(tmp_path)
    state = tmp_path / "state"
    with serving(
        gymhost_command("serve", str(folder), "--port", "0", *options), env={"XDG_STATE_HOME": str(state)}
    ) as server:
        port = int(server.url.rsplit(":", 1)[1])
        kept = state / "gymhost" / "secret"
        assert kept.is_file(), server.output  # made by the supervisor, outside
        code = REACH.replace("FOLDER", repr(str(folder))).replace("VENV", repr(VENV_PACKAGES))
        code = code.replace("KEPT", repr(str(kept))).replace("PORT", str(port)).replace("OUTSIDE", repr(_an_address()))
        code = code.replace("OWN_DATA", repr(str(folder / "data" / "guesses.txt")))
        code = code.replace("ROWS", repr(str(folder / "data" / "train.jsonl")))
        async with EpisodeClient(server.url) as episode:
            await episode.seed(ROW)
            answer = await episode.post("/verify", {**ROW, "response": response_saying(code)})
        assert answer.status_code == 200, answer.text
        printed = answer.json()["printed"]
        assert printed.startswith("{"), printed
    return json.loads(printed), server.output


async def test_a_confined_gym_server_and_the_code_it_runs_reach_nothing_beyond_their_scratch(tmp_path: Path) -> None:
    reached, output = await reach_from_the_models_code(tmp_path, "--sandbox", "strict")
    assert "its own code runs confined: bubblewrap" in output, output
    assert "a private /tmp, no network" in output, output
    assert reached["uid"] != 0, reached  # the server runs as root; it and what it starts do not
    assert reached["shadow"] == "Permission denied", reached
    assert reached["folder"] == "Read-only file system", reached  # the tasks and grader of every later episode
    assert reached["venv"] in ("Read-only file system", "Permission denied"), reached
    # Its server is the same user, but not dumpable: where the signing secret and the token are is out of reach.
    assert reached["server memory"] == "Permission denied", reached
    assert reached["server environment"] == "Permission denied", reached
    assert reached["kept secret"] == "No such file or directory", reached
    assert reached["sandbox's first process"] == "Permission denied", reached  # bubblewrap's, root's here
    assert reached["server"] == "Connection refused", reached  # the sandbox's own loopback, where nothing listens
    assert reached["outside"] == "Network is unreachable", reached
    assert reached["processes"] <= 4, reached  # the sandbox's: its first, the server, the code and its shell
    assert reached["scratch"] == "done", reached
    assert "its dataset rows out of sight (1 file its configs declare)" in output, output
    # The rows and their answers, never the server's to read: covered by /dev/null, which a mount without devices
    # refuses to open.
    assert reached["rows"] == "Permission denied", reached
    assert reached["its own data"] == "crane", reached


async def test_sandbox_off_leaves_the_same_code_the_servers_reach(tmp_path: Path) -> None:
    reached, output = await reach_from_the_models_code(tmp_path, "--sandbox", "off")
    assert "runs confined" not in output, output
    for attempt in ("folder", "venv", "server", "scratch"):
        assert reached[attempt] == "done", (attempt, reached)
    assert reached["outside"] == "Connection refused", reached  # it reached the machine; nothing listens on 9
    if os.getuid() == 0:
        for attempt in ("shadow", "server memory", "server environment", "kept secret"):
            assert reached[attempt] == "done", (attempt, reached)
    assert reached["processes"] > 4, reached
    assert (reached["rows"], reached["its own data"]) == (ROWS_TEXT, "crane"), reached


async def test_a_confined_server_drains_on_sigterm_and_leaves_no_process(tmp_path: Path) -> None:
    """SIGTERM reaches the server inside the sandbox as it reaches an unconfined one: an open episode ends verified,
    then the server stops, the sandbox with it, and the exit status says SIGTERM."""
    folder = runner_folder(tmp_path)
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict")) as server:
        inside = descendants(server.process.pid)
        assert len(inside) == 3, inside  # bubblewrap, the sandbox's first process, the server
        async with EpisodeClient(server.url) as episode:
            await episode.seed(ROW)
            server.process.send_signal(signal.SIGTERM)
            async with httpx.AsyncClient(base_url=server.url, timeout=STATE_TIMEOUT_S) as probe:
                while (await probe.get("/readyz")).status_code == 200:  # the drain has begun inside
                    await anyio.sleep(0.05)
            answer = await episode.post("/verify", {**ROW, "response": response_saying("print('done')")})
        assert answer.status_code == 200, answer.text
        assert answer.json()["printed"] == "done\n"
        # The drain ended with its last episode: the server stops by itself, as the signal asked.
        assert server.process.wait(STATE_TIMEOUT_S) == -signal.SIGTERM, server.output
    assert "draining: no new episodes" in server.output, server.output
    assert "Traceback" not in server.output, server.output
    assert not [pid for pid in inside if alive(pid)], inside


async def test_the_secret_and_the_token_never_reach_a_confined_servers_children(tmp_path: Path) -> None:
    """As unconfined (test_secrets_kept), the secret travels into the sandbox and is taken out of the server's
    environment before its code is imported: the model's code finds neither, in its own environment or its
    server's; and an episode the supervisor's secret signed is the server's."""
    folder = runner_folder(tmp_path)
    look = "import json, os\nprint(json.dumps(dict(os.environ)))\n"
    command = gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict")
    with serving(command, env={"GYMHOST_SECRET": SECRET, "GYMHOST_TOKEN": "a-token"}) as server:
        assert "sessions are signed with GYMHOST_SECRET" in server.output, server.output
        async with EpisodeClient(server.url, token="a-token") as episode:
            await episode.seed(ROW)
            answer = await episode.post("/verify", {**ROW, "response": response_saying(look)})
    assert answer.status_code == 200, answer.text
    seen = answer.json()["printed"]
    assert "PATH" in json.loads(seen), seen
    assert SECRET not in seen, seen
    assert "a-token" not in seen, seen


def test_strict_under_an_asgi_server_refuses_a_gym_server(tmp_path: Path) -> None:
    """uvicorn imports the app into its own process, which gymhost cannot confine: strict says so and does not
    serve, where it would otherwise serve the Gym server unconfined."""
    folder = runner_folder(tmp_path)
    done = run_to_completion(
        [sys.executable, "-m", "uvicorn", "gymhost.asgi:app", "--port", "0"],
        env={"GYMHOST_FOLDER": str(folder), "GYMHOST_SANDBOX": "strict"},
    )
    assert done.returncode != 0, done
    assert "--sandbox strict: runner is a Gym server, whose own process only gymhost serve confines" in done.stderr


def test_a_confined_server_that_fails_to_build_says_why_in_one_record(tmp_path: Path) -> None:
    """An error inside the sandbox ends the server as one outside does: one line (here a JSON record), no traceback."""
    broken = make_folder(
        tmp_path, name="broken", config=CONFIG.format(key="broken", name="broken"), app="raise RuntimeError('broken')\n"
    )
    done = run_to_completion(
        gymhost_command("serve", str(broken), "--port", "0", "--sandbox", "strict", "--log-format", "json")
    )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert (last["level"], last["logger"]) == ("ERROR", "gymhost"), last
    assert last["message"].endswith("app.py: importing it failed: RuntimeError('broken')"), last


# What the model's code does in a confined runner behind a gateway: looks at who it is and what processes it sees,
# and writes, where its server keeps its metrics for the gateway to read, files that do not hold values, and files
# that would pass for gymhost's own families or relabel them (another help text, a sample of another type, a name
# the exposition rewrites into one of gymhost's, a label gymhost's family does not have).
FORWARDS = json.dumps(_DECLARED["gymhost_forward_failures"].help)  # gymhost's, word for word
LOOK_AND_FORGE = """\
import os
from prometheus_client.mmap_dict import MmapedDict
folder = os.environ["PROMETHEUS_MULTIPROC_DIR"]
forged = {
    "counter_forged-1.db": "not json",
    "counter_forged-2.db": '["x", "x_total", {"mount": ["/"]}, ""]',
    "counter_forged-3.db": '["gymhost_masked_verdicts_refused", "gymhost_masked_verdicts_refused_total", {}, "forged"]',
    "counter_forged-4.db": '["gymhost_episodes_open", "gymhost_episodes_open_total", {"mount": "/runner"}, ""]',
    "gauge_all_forged-5.db": '["gymhost.episodes.open", "gymhost.episodes.open", {"mount": "/runner"}, "forged"]',
    "gauge_livesum_forged-6.db": '["gymhost_handoffs_total", "gymhost_handoffs_total", {"mount": "/runner"}, ""]',
    "counter_forged-7.db": '["gymhost_sessions_started", "gymhost_sessions_started_total", {"mount": "/runner", '
    '"forged": "1"}, "Sessions seeded (POST /seed_session answered 2xx), on any server."]',
    # As gymhost declares it, of another mount (the written folder's, served by the gateway beside the runner):
    "counter_forged-8.db": '["gymhost_sessions_started", "gymhost_sessions_started_total", {"mount": "/WRITTEN"}, '
    '"Sessions seeded (POST /seed_session answered 2xx), on any server."]',
    # Its own, of no mount: counted as the runner's; in one file with a sample of another mount, left out alone.
    "counter_runner-9.db": '["runner_unlabelled", "runner_unlabelled_total", {}, "of no mount"]',
    "counter_runner-10.db": [
        '["runner_calls", "runner_calls_total", {"mount": "/runner"}, "its own"]',
        '["gymhost_sessions_started", "gymhost_sessions_started_total", {"mount": "/WRITTEN"}, '
        '"Sessions seeded (POST /seed_session answered 2xx), on any server."]',
    ],
    "counter_forged-11.db": '["runner_odd", "runner_odd_total", {"a.b": "forged"}, ""]',
    "counter_forged-12.db": '["runner_named", "runner_named_total", {"__name__": "forged"}, ""]',
    "counter_forged-13.db": '["gymhost_forward_failures", "gymhost_forward_failures_total", '
    '{"reason": "forged", "target": "worker"}, FORWARDS]',
}
for name, keys in forged.items():
    values = MmapedDict(os.path.join(folder, name))
    for key in [keys] if isinstance(keys, str) else keys:
        values.write_value(key, 1.0, 0.0)
    values.close()
print(os.getuid(), sum(e.isdigit() for e in os.listdir('/proc')))
"""


FORGE_OPEN = """\
import os
from prometheus_client.mmap_dict import MmapedDict
values = MmapedDict(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], "gauge_livesum_forged.db"))
values.write_value('["gymhost_episodes_open", "gymhost_episodes_open", {"mount": "/runner"}, '
                   '"Episodes seeded and not yet ended."]', -1.0, 0.0)
values.close()
print("none open")
"""


async def test_a_gateways_drain_waits_for_a_confined_servers_episode_whatever_its_code_wrote(tmp_path: Path) -> None:
    """A gateway waits in a drain for the episodes its process mounts hold, as each counts them itself: the model's
    code in a confined server, which may write among its server's metrics, once made its open episodes read as
    none there, and the gateway stopped it with an episode open. (A written folder beside it keeps the gateway
    unconfined, its Gym server a process of its own.)"""
    root = tmp_path / "root"
    await awrite_folder(str(make_bundle(tmp_path / "bundles")), root, instances=1, mode="process")
    make_folder(
        root / "resources_servers", name="runner", config=CONFIG.format(key="runner", name="runner"), app=RUNNER
    )
    command = gymhost_command("serve", str(root), "--port", "0", "--sandbox", "strict", "--drain-timeout", "60")
    with serving(command) as server:
        async with EpisodeClient(f"{server.url}/runner") as forger:
            await forger.seed(ROW)
            forged = await forger.post("/verify", {**ROW, "response": response_saying(FORGE_OPEN)})
            assert forged.json()["printed"] == "none open\n", forged.text
        async with EpisodeClient(f"{server.url}/runner") as episode, httpx.AsyncClient(base_url=server.url) as probe:
            await episode.seed(ROW)
            with anyio.fail_after(STATE_TIMEOUT_S):  # the gateway has read the episode open
                while (await probe.get("/readyz")).headers.get("gymhost-open-episodes") != "1":
                    await anyio.sleep(0.1)
            server.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(STATE_TIMEOUT_S):
                while (await probe.get("/readyz")).status_code == 200:  # the drain has begun
                    await anyio.sleep(0.05)
            answer = await episode.post("/verify", {**ROW, "response": response_saying("print('done')")})
        assert answer.status_code == 200, answer.text
        assert answer.json()["printed"] == "done\n"
        server.process.wait(STATE_TIMEOUT_S)
    assert "for 1 open episode(s) to end" in server.output, server.output
    assert "drained: every open episode has ended" in server.output, server.output


async def test_strict_on_a_root_with_written_folders_confines_each_gym_server_in_a_process_of_its_own(
    tmp_path: Path,
) -> None:
    """A template cannot confine its instances from inside a sandbox, so a gateway holding a written folder is not
    confined as a whole: its Gym servers are, each in a process of its own behind it, and the gateway's /metrics
    still counts their sessions, past what the code they run writes among their metrics. Under ``--log-format
    json`` every line is JSON, those processes' own too."""
    root = tmp_path / "root"
    bundle = make_bundle(tmp_path / "bundles")
    written = (await awrite_folder(str(bundle), root, instances=1, mode="process")).path
    make_folder(
        root / "resources_servers", name="runner", config=CONFIG.format(key="runner", name="runner"), app=RUNNER
    )
    command = gymhost_command("serve", str(root), "--port", "0", "--sandbox", "strict", "--log-format", "json")
    with serving(command) as server:
        async with EpisodeClient(f"{server.url}/{written.name}") as episode:
            await episode.seed(rows(written)[0])
            assert (await episode.call_tool("increment", {"by": 2})).ok
            assert (await episode.verify(rows(written)[0]))["reward"] == 1.0
        async with EpisodeClient(f"{server.url}/runner") as episode:
            await episode.seed(ROW)
            metrics = httpx.get(f"{server.url}/metrics", timeout=STATE_TIMEOUT_S).text
            forge = LOOK_AND_FORGE.replace("/WRITTEN", f"/{written.name}").replace("FORWARDS", FORWARDS)
            answer = await episode.post("/verify", {**ROW, "response": response_saying(forge)})
        assert 'gymhost_sessions_started_total{mount="/runner"} 1.0' in metrics, metrics
        assert answer.status_code == 200, answer.text
        # The model's code wrote files of its own where the runner keeps its metrics: the gateway reads past them.
        after = httpx.get(f"{server.url}/metrics", timeout=STATE_TIMEOUT_S)
        assert after.status_code == 200, after.text
        assert 'gymhost_sessions_started_total{mount="/runner"} 1.0' in after.text, after.text
        assert f'gymhost_sessions_started_total{{mount="/{written.name}"}} 1.0' in after.text, after.text
        assert 'runner_calls_total{mount="/runner"} 1.0' in after.text, after.text  # its own, of its mount
        assert 'runner_unlabelled_total{mount="/runner"} 1.0' in after.text, after.text
        assert "forged" not in after.text, after.text
        assert "gymhost_episodes_open_total" not in after.text, after.text
        assert after.text.count("# TYPE gymhost_handoffs_total") <= 1, after.text
        uid, processes = map(int, answer.json()["printed"].split())
        assert uid != 0, answer.text
        assert processes <= 4, answer.text  # in the runner's own sandbox
    messages = [json.loads(line)["message"] for line in server.lines]
    assert sum("its own code runs confined: bubblewrap" in said for said in messages) == 1, server.output
    assert any("hosted code confinement: namespaces" in said for said in messages), server.output  # its instances
    assert any(said.startswith("serving runner at ") for said in messages), "the runner's process said it is serving"
    assert sum("its entries are not what prometheus_client writes" in said for said in messages) == 2, server.output
    assert sum("would pass for, or relabel, one of gymhost's metrics" in said for said in messages) == 5, server.output
    assert sum("is not of /runner, the one mount its server serves" in said for said in messages) == 2, server.output
    assert sum("label names the exposition would rewrite" in said for said in messages) == 2, server.output
    assert sum("is of no mount, as the gateway's own process's is" in said for said in messages) == 1, server.output
    refused = run_to_completion(
        gymhost_command("serve", str(root), "--port", "0", "--sandbox", "strict", "--workers", "2")
    )
    assert refused.returncode == 1, refused
    assert "/runner: runner is a Gym server, confined under --sandbox strict, and so a process of its own" in (
        refused.stderr
    )
