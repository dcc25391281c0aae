"""The server's secrets never reach the code it hosts (issue 43, item 1), nor its listening socket.

A real ``gymhost serve`` with ``GYMHOST_SECRET`` and ``GYMHOST_TOKEN`` in its environment, as an operator starts it:

- a Gym-style server whose verify runs the model's text in a subprocess, as Gym's ``code_gen`` does ("no sandbox"):
  the child's environment holds neither, and neither does what it reads of its server's (``/proc/PPID/environ``);
- a written bundle's process instance: its own environment is an allow-list, and its template's and its server's
  hold neither value.

And a Gym server that runs the model's code as Gym's local sandbox does (``asyncio.create_subprocess_exec``, on the
server's event loop, uvloop): the code holds no socket of the server's to accept the trainer's requests on.
(tests/test_confinement.py has the same look from a process instance.)

Each look also finds what it must (``PATH``; the instance's ``GYMHOST_TEMPLATE_SERVER_PID`` in its template's), so
a look that read nothing cannot pass.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient
from gymhost.environments import awrite_folder

from .agentenv_helpers import COUNTER_ENV, make_bundle, rows
from .conftest import REPO
from .processes import free_port, gymhost_command, serving
from .test_folder_errors import CONFIG, make_folder

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

SECRET = "the-signing-secret-no-hosted-code-may-read"
TOKEN = "the-bearer-token-no-hosted-code-may-read"
SECRETS = {"GYMHOST_SECRET": SECRET, "GYMHOST_TOKEN": TOKEN}
CREDENTIAL = {"CLOUD_API_KEY": "an-operators-credential"}  # not gymhost's: hosted code gets an allow-list

# A Gym resources server whose verify runs the model's text, as code_gen's does, and answers what it printed.
RUNNER = """\
import subprocess
import sys

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)


class RunVerifyResponse(BaseVerifyResponse):
    printed: str


class RunnerServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    async def verify(self, body: BaseVerifyRequest) -> RunVerifyResponse:
        code = "".join(
            getattr(part, "text", "") for item in body.response.output for part in getattr(item, "content", None) or []
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return RunVerifyResponse(**body.model_dump(), reward=1.0, printed=done.stdout + done.stderr)


if __name__ == "__main__":
    RunnerServer.run_webserver()
"""

# What the model's code looks at: its own environment and its parent's (the server's), as /proc shows them.
LOOK = """\
import json, os
parent = open(f"/proc/{os.getppid()}/environ", "rb").read().decode("latin-1")
print(json.dumps({"environ": dict(os.environ), "parent": parent}))
"""


# The same server running the code as Gym's local sandbox provider does, on the server's event loop, and passing it
# every inheritable descriptor, as uvloop does whatever it is told (and as ``os.system`` does).
ASYNC_RUNNER = RUNNER.replace("import subprocess\n", "import asyncio\n").replace(
    """        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return RunVerifyResponse(**body.model_dump(), reward=1.0, printed=done.stdout + done.stderr)""",
    """        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            close_fds=False,
        )
        printed, _ = await asyncio.wait_for(process.communicate(), timeout=120)
        return RunVerifyResponse(**body.model_dump(), reward=1.0, printed=printed.decode())""",
)

# Every socket with an address that the model's code holds: with its server's listening socket it could take the
# trainer's next requests, with the connection its own ``/verify`` came on it could answer it, its own reward in it.
# A socket of its own is found too.
SOCKETS = """\
import json, os, socket
own = socket.socket(socket.AF_UNIX)
own.bind("\\0a-socket-of-its-own-" + str(os.getpid()))
own.listen()
found = []
for name in os.listdir("/proc/self/fd"):
    try:
        with socket.socket(fileno=os.dup(int(name))) as held:
            try:
                peer = held.getpeername()
            except OSError:
                peer = ""
            if held.getsockname() or peer:
                found.append(f"{held.getsockname()} {peer}")
    except OSError:
        pass
print(json.dumps(found))
"""


def response_saying(text: str) -> dict[str, Any]:
    message = {"id": "m", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return {"id": "r", "object": "response", "created_at": 0, "model": "m", "output": [message], "tools": [],
            "parallel_tool_calls": True, "tool_choice": "auto"}  # fmt: skip


def assert_hidden(seen: str) -> None:
    assert SECRET not in seen, "the signing secret reached hosted code"
    assert TOKEN not in seen, "the bearer token reached hosted code"


async def test_a_gym_servers_subprocess_finds_no_secret(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, name="runner", config=CONFIG.format(key="runner", name="runner"), app=RUNNER)
    with serving(gymhost_command("serve", str(folder), "--port", "0"), env=SECRETS) as server:
        async with EpisodeClient(server.url, token=TOKEN) as episode:
            row = {"responses_create_params": {"input": [{"role": "user", "content": "print your environment"}]}}
            await episode.seed(row)
            answer = await episode.post("/verify", {**row, "response": response_saying(LOOK)})
    assert answer.status_code == 200, answer.text
    verdict = answer.json()
    assert verdict["printed"].startswith("{"), verdict
    seen = json.loads(verdict["printed"])
    assert "PATH" in seen["environ"], seen  # it looked
    assert "PATH=" in seen["parent"], seen
    assert_hidden(verdict["printed"])


# The counter bundle with a tool that reports what its instance sees: its environment, its template's (its parent)
# and its server's (the template's parent).
LOOKING_ENV = COUNTER_ENV.replace(
    """    @tool(name="stall")""",
    '''    @tool(name="look")
    async def look(self) -> dict[str, Any]:
        """What this process can see of its own environment and its parents'."""
        import os

        def environ(pid: int) -> str:
            with open(f"/proc/{pid}/environ", "rb") as file:
                return file.read().decode("latin-1")

        template = os.getppid()
        with open(f"/proc/{template}/stat") as stat:
            server = int(stat.read().rsplit(")", 1)[1].split()[1])
        return {"environ": dict(os.environ), "template": environ(template), "server": environ(server)}

    @tool(name="stall")''',
).replace("{TOOL}", "increment")


async def test_a_process_instance_finds_no_secret(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundles")
    (bundle / "env.py").write_text(LOOKING_ENV)
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="process")).path
    row = rows(folder)[0]
    # Unconfined (a confined instance cannot read its template's environment, nor see its server): the secrets are
    # kept whatever the sandbox (tests/test_confinement.py has the confined instance).
    command = gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "off")
    with serving(command, env={**SECRETS, **CREDENTIAL}) as server:
        async with EpisodeClient(server.url, token=TOKEN) as episode:
            await episode.seed(row)
            answer = await episode.post("/look", {})
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert "PATH" in seen["environ"], seen  # it looked
    assert "GYMHOST_TEMPLATE_SERVER_PID=" in seen["template"], seen
    assert "PATH=" in seen["server"], seen
    assert_hidden(answer.text)
    assert not {name for name in seen["environ"] if name.startswith("GYMHOST_")}, seen["environ"]
    assert "CLOUD_API_KEY" not in seen["environ"]
    assert "an-operators-credential" not in seen["template"]


# How the server runs: gymhost serve (one process; two workers, which hand connections to each other; hypercorn, which
# makes its sockets inheritable), and hypercorn's own command (its socket made in its supervisor, inheritable).
SERVERS = {
    "serve": ["serve", "--port", "0"],
    "serve --workers 2": ["serve", "--port", "0", "--workers", "2"],
    "serve --server hypercorn": ["serve", "--port", "0", "--server", "hypercorn"],
    "hypercorn asgi:app": [sys.executable, "-m", "hypercorn", "asgi:app", "--bind", "127.0.0.1:{port}"],
}


@pytest.mark.parametrize("how", SERVERS)
async def test_the_code_a_gym_server_runs_holds_no_socket_of_the_servers(tmp_path: Path, how: str) -> None:
    """With two workers, a connection that reaches the worker not holding its episode is handed to the one that
    does: each call below comes on a connection of its own, until one was handed over."""
    folder = make_folder(tmp_path, name="runner", config=CONFIG.format(key="runner", name="runner"), app=ASYNC_RUNNER)
    options: dict[str, Any] = {}
    if how.startswith("serve"):
        command = gymhost_command(*SERVERS[how][:1], str(folder), *SERVERS[how][1:])
    else:  # asgi.py from the checkout, as test_processes.py runs it
        port = free_port()
        command = [part.format(port=port) for part in SERVERS[how]]
        options = {"cwd": REPO, "env": {"GYMHOST_FOLDER": str(folder)}, "url": f"http://127.0.0.1:{port}"}
    with serving(command, **options) as server:
        async with EpisodeClient(server.url) as episode:
            row = {"responses_create_params": {"input": [{"role": "user", "content": "take the next request"}]}}
            await episode.seed(row)
            body = {**row, "response": response_saying(SOCKETS)}
            answers = [await episode.post("/verify", body)]
            workers = "--workers" in how
            while workers and handoffs(server.url) == 0 and len(answers) < 64:
                answers.append(await episode.post("/verify", body))
            assert not workers or handoffs(server.url) > 0, "no connection was handed over"
    for answer in answers:
        assert answer.status_code == 200, answer.text
        printed = answer.json()["printed"]
        assert printed.startswith("["), printed
        found = json.loads(printed)
        assert [name for name in found if "a-socket-of-its-own" not in name] == [], found  # nothing of its server's
        assert len(found) == 1, found  # its own: the look finds what it must


def handoffs(url: str) -> float:
    """Connections handed over between the server's workers, by its metrics."""
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(value) for value in re.findall(r'gymhost_handoffs_total\{outcome="sent"\} (\S+)', metrics))
