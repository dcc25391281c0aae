"""Process instances run confined (issue 43, item 2): what hosted code can reach from inside one, on a real
``gymhost serve``, against real namespaces (bubblewrap, as root: these machines run the suite as root, the hard case).

A written bundle's ``reach`` tool tries, from inside its instance, each thing the issue found an instance could do:
read what only root may, write into its own bundle and into the server's venv, read the served folder's rows and
its bundle's tasks (their grading and solutions),
connect to its own server and elsewhere, name its parent or any other process to signal it. Confined (the
default), every one is refused; served with ``--sandbox off`` the same tool does each of them, so a refusal is the
sandbox's doing and not a probe that could not have worked.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient
from gymhost.environments import awrite_folder

from .agentenv_helpers import COUNTER_ENV, make_bundle, pool_status_of, rows
from .processes import gymhost_command, run_to_completion, serving, without_user_namespaces

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

# The counter bundle with a tool that tries to reach beyond its instance, and says what happened to each try.
REACH_ENV = COUNTER_ENV.replace(
    """    @tool(name="stall")""",
    '''    @tool(name="reach")
    async def reach(self, server_port: int, venv: str, folder: str, tasks: str, outside: str) -> dict[str, Any]:
        """Everything this process should not reach, tried."""
        import os
        import socket
        import tempfile
        import uuid

        def attempt(action: Any) -> Any:
            try:
                action()
                return "done"
            except OSError as error:
                return os.strerror(error.errno) if error.errno else repr(error)

        def write_in(where: str) -> None:
            path = os.path.join(where, f"written-by-an-instance-{uuid.uuid4().hex}")
            with open(path, "w") as file:
                file.write("an instance wrote this")
            os.unlink(path)  # served unconfined, it leaves nothing behind

        def connect(host: str, port: int) -> None:
            with socket.create_connection((host, port), timeout=5):
                pass

        def connect_unix(path: str) -> None:
            with socket.socket(socket.AF_UNIX) as unix:
                unix.connect(path)

        def listening_on(fd: int) -> str | None:
            """The name of the socket ``fd`` is, if one that can accept connections; else None."""
            try:
                with socket.socket(fileno=os.dup(fd)) as held:
                    if held.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        return str(held.getsockname())
            except OSError:  # not a socket (or the listing's own descriptor, closed by now)
                pass
            return None

        def same_file(fd: int, other: int) -> bool:
            try:
                mine, theirs = os.fstat(fd), os.fstat(other)
            except OSError:
                return False
            return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)

        def capabilities() -> dict[str, int]:
            with open("/proc/self/status") as status:
                return {line.split(":")[0]: int(line.split()[1], 16) for line in status if line.startswith("Cap")}

        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
        bundle = os.path.dirname(os.path.abspath(__file__))
        return {
            # What the process holds of its server's: sockets that accept connections (its own channel is one),
            # and copies of its output (the server's) beyond its own stdout and stderr.
            "listening": [name for fd in descriptors if (name := listening_on(fd)) is not None],
            "output copies": [fd for fd in descriptors if fd > 2 and same_file(fd, 2)],
            "uid": os.getuid(),
            # Its capabilities, each set (effective, permitted, bounding...) as /proc says: with any, it could undo
            # its mounts in its namespaces, or, as root, get past file permissions.
            "capabilities": capabilities(),
            "shadow": attempt(lambda: open("/etc/shadow").read()),
            "bundle": attempt(lambda: write_in(bundle)),
            "venv": attempt(lambda: write_in(venv)),
            "rows": attempt(lambda: open(os.path.join(folder, "data", "eval.jsonl")).read()),
            # The bundle's tasks, with their grading and solutions: the bundle's code is in sight, they are not;
            # nor through a link in the bundle that leads to them.
            "tasks": attempt(lambda: open(tasks).read()),
            "linked tasks": attempt(lambda: open(os.path.join(bundle, "linked", os.path.basename(tasks))).read()),
            "linked rows": attempt(lambda: open(os.path.join(bundle, "up", "data", "eval.jsonl")).read()),
            "server": attempt(lambda: connect("127.0.0.1", server_port)),
            "outside": attempt(lambda: connect(outside, 9)),
            "parent": os.getppid(),
            # The processes it can name but itself (a pidfd opens for a process, never for one of its threads):
            # a new PID namespace's numbers start at 1; its parent's is there too, unless outside its namespace.
            "others": [
                number
                for number in sorted({*range(1, 4096), os.getppid()} - {0, os.getpid()})
                if attempt(lambda: os.close(os.pidfd_open(number))) == "done"
            ],
            "scratch": attempt(lambda: write_in(tempfile.gettempdir())),
            "tmp": attempt(lambda: write_in("/tmp")),  # the machine's, where namespaces give it a /tmp of its own
            "signal parent": attempt(lambda: os.kill(os.getppid(), 0)),  # 0: only asks whether it may
            # Its own channel, where a landlock instance's scratch sits beside the instances' channels.
            "channel": attempt(lambda: connect_unix(os.path.join(os.path.dirname(os.getcwd()), "0.sock"))),
        }

    @tool(name="stall")''',
).replace("{TOOL}", "increment")

# The capability sets /proc/PID/status shows.
CAPABILITY_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")

# A site-packages folder of the server's own venv: hosted code must not replace the server's code there.
VENV_PACKAGES = str(Path(pytest.__file__).parent.parent)


# An environment whose import starts a thread cannot be forked: each instance is started on its own (``--serve``),
# and confines itself there.
STARTED_ON_ITS_OWN = "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
HOW = {"forked": "", "started on its own": STARTED_ON_ITS_OWN}


async def reach_from_an_instance(
    tmp_path: Path,
    *options: str,
    how: str = "forked",
    wrap: Callable[[list[str]], list[str]] = list,
    root: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """What the ``reach`` tool of a served process instance reports, and the server's output; ``wrap``: how the
    server's command is run (``without_user_namespaces``); ``root``: where the folder is written (else in
    ``tmp_path``), every user then let read it and enter its folders, as a volume the image serves may be."""
    bundle = make_bundle(tmp_path / "bundles")
    (bundle / "env.py").write_text(HOW[how] + REACH_ENV)
    folder = (await awrite_folder(str(bundle), root or tmp_path / "root", instances=1, mode="process")).path
    tasks = folder / "bundle" / "tasks" / "eval.jsonl"
    assert '"grading"' in tasks.read_text()  # what a probe that reads it would learn
    (folder / "bundle" / "linked").symlink_to("tasks")  # as a bundle edited by hand may hold, and one that dangles
    (folder / "bundle" / "dangling").symlink_to("nowhere")
    (folder / "bundle" / "up").symlink_to("..")
    for path in [root, *root.rglob("*")] if root is not None else []:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    with serving(wrap(gymhost_command("serve", str(folder), "--port", "0", *options))) as server:
        port = int(server.url.rsplit(":", 1)[1])
        async with EpisodeClient(server.url) as episode:
            await episode.seed(rows(folder)[0])
            arguments = {"server_port": port, "venv": VENV_PACKAGES, "folder": str(folder), "tasks": str(tasks)}
            arguments["outside"] = _an_address()
            answer = await episode.post("/reach", arguments)
            assert answer.status_code == 200, answer.text
            reached = answer.json()
        # What the server says of it: its pool's status, and the metric.
        reached["pool says"] = pool_status_of(server.url)["confinement"]
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        reached["metric says"] = re.findall(r'gymhost_instance_confinement\{level="(\w+)",mount="/"\} 1\.0', metrics)
    return reached, server.output


def assert_holds_nothing_of_its_servers(reached: dict[str, Any]) -> None:
    """The instance accepts connections on its own channel and nowhere else (with the server's listening socket it
    would take the trainer's requests, ``/verify`` included, and answer them itself), and writes the server's output
    only through the stderr it is given (a copy of the server's stdout would let it write the start line and the
    access log). uvloop passes every inheritable descriptor on to the processes it starts, whatever ``close_fds``
    says (libuv has no such step), and copies of their standard streams with them."""
    assert [name.rsplit("/", 1)[-1] for name in reached["listening"]] == ["0.sock"], reached
    assert reached["output copies"] == [], reached


def _an_address() -> str:
    """An address of this machine beyond loopback, where one exists (else loopback's other end of 127/8)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the route's source address
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.2"


@pytest.mark.parametrize("how", HOW)
async def test_a_confined_instance_reaches_nothing_beyond_its_scratch(tmp_path: Path, how: str) -> None:
    reached, output = await reach_from_an_instance(tmp_path, how=how)
    assert "hosted code confinement: namespaces" in output, output
    assert (reached["pool says"], reached["metric says"]) == ("namespaces", ["namespaces"]), reached
    assert reached["uid"] != 0, reached  # the server runs as root; its hosted code does not
    assert reached["capabilities"] == dict.fromkeys(CAPABILITY_SETS, 0), reached
    assert reached["shadow"] == "Permission denied", reached
    assert reached["bundle"] == "Read-only file system", reached
    assert reached["venv"] in ("Read-only file system", "Permission denied"), reached
    assert reached["rows"] == "No such file or directory", reached  # the served folder is out of its sight
    assert reached["tasks"] == "No such file or directory", reached  # and so are its bundle's tasks
    assert reached["linked tasks"] == reached["linked rows"] == "No such file or directory", reached
    assert reached["server"] == "Connection refused", reached  # its own loopback, where nothing listens
    assert reached["outside"] == "Network is unreachable", reached
    # Its parent is outside its PID namespace, and so is every other process: it can name none to signal it.
    assert reached["parent"] == 0, reached
    assert reached["others"] == [], reached
    assert reached["scratch"] == "done", reached
    assert reached["tmp"] == "done", reached  # its own /tmp
    assert_holds_nothing_of_its_servers(reached)


@pytest.mark.parametrize("how", HOW)
async def test_without_namespaces_landlock_and_seccomp_keep_an_instance_to_its_scratch(
    tmp_path: Path, how: str
) -> None:
    """Where no namespaces may be made (here: a user namespace where no other may be), ``auto`` restricts each
    instance with Landlock and seccomp: it writes only its own scratch, reads neither the served folder nor what
    only root may, reaches no address and signals no process outside itself. It still runs as the server's user
    and can name the host's processes: what namespaces add (docs/security.md)."""
    reached, output = await reach_from_an_instance(tmp_path, how=how, wrap=without_user_namespaces)
    assert "restricted by Landlock and seccomp" in output, output
    assert (reached["pool says"], reached["metric says"]) == ("landlock", ["landlock"]), reached
    assert reached["shadow"] == "Permission denied", reached  # not readable by all: not in its sight, even as root
    assert reached["capabilities"] == dict.fromkeys(CAPABILITY_SETS, 0), reached
    assert reached["bundle"] == "Permission denied", reached
    assert reached["venv"] == "Permission denied", reached
    assert reached["rows"] == "Permission denied", reached
    assert reached["tasks"] == "Permission denied", reached  # its bundle's code is readable, its tasks not
    assert reached["linked tasks"] == reached["linked rows"] == "Permission denied", reached
    assert reached["server"] == "Permission denied", reached  # no socket but a Unix one
    assert reached["outside"] == "Permission denied", reached
    assert reached["signal parent"] == "Operation not permitted", reached
    assert reached["channel"] == "Permission denied", reached  # no connection at all: not a sibling's channel
    assert reached["tmp"] == "Permission denied", reached  # the machine's /tmp: nothing left there for the next
    assert reached["scratch"] == "done", reached
    assert reached["parent"] in reached["others"], reached  # no PID namespace of its own
    assert_holds_nothing_of_its_servers(reached)


async def test_a_folder_anyone_may_read_is_out_of_a_confined_instances_sight(tmp_path: Path) -> None:
    """A served folder outside ``/tmp`` (which the sandbox replaces with a scratch of its own) that every user may
    read, as a volume mounted in the image is: its rows and its bundle's tasks are still out of sight, the bundle's
    code in it, and its tasks' grading and solutions with the rest of the folder covered."""
    root = Path(tempfile.mkdtemp(prefix="gymhost-test-readable-folder-", dir="/var/tmp"))
    try:
        reached, _ = await reach_from_an_instance(tmp_path, root=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert reached["rows"] == "No such file or directory", reached
    assert reached["tasks"] == "No such file or directory", reached
    assert reached["bundle"] == "Read-only file system", reached  # its code, in sight


async def test_a_template_started_by_a_worker_hands_nothing_of_its_servers_on(tmp_path: Path) -> None:
    """Each worker of ``--workers 2`` starts its template on its event loop (uvloop), not before it as one server
    does, once the workers' own sockets exist (the listening one, and each worker's for forwards and hand-overs):
    whatever the loop passes on, the template's instances do not hold."""
    reached, _ = await reach_from_an_instance(tmp_path, "--workers", "2")
    assert (reached["pool says"], reached["metric says"]) == ("namespaces", ["namespaces"]), reached
    assert_holds_nothing_of_its_servers(reached)


async def test_a_folder_that_asks_for_the_network_gets_it_and_nothing_more(tmp_path: Path) -> None:
    """``network: true`` in the folder's source (here from the command line): its instances share the machine's
    network, and stay confined in every other way."""
    reached, _ = await reach_from_an_instance(tmp_path, "--set", "source.network=true")
    assert reached["server"] == "done", reached  # the server's own port, on the machine's loopback
    assert reached["uid"] != 0, reached
    assert (reached["shadow"], reached["bundle"], reached["rows"], reached["tasks"]) == (
        "Permission denied",
        "Read-only file system",
        "No such file or directory",
        "No such file or directory",
    ), reached
    assert (reached["parent"], reached["others"]) == (0, []), reached


async def test_sandbox_off_leaves_the_same_instance_the_servers_reach(tmp_path: Path) -> None:
    reached, output = await reach_from_an_instance(tmp_path, "--sandbox", "off")
    assert "hosted code confinement: none" in output, output
    assert (reached["pool says"], reached["metric says"]) == ("none", ["none"]), reached
    assert os.getuid() != 0 or reached["uid"] == 0, reached
    for attempt in ("bundle", "venv", "rows", "tasks", "linked tasks", "linked rows", "scratch", "tmp"):
        assert reached[attempt] == "done", (attempt, reached)
    assert reached["signal parent"] == "done", reached
    if os.getuid() == 0:
        assert reached["shadow"] == "done", reached
        assert reached["capabilities"]["CapEff"] != 0, reached  # root's, as the server has them
    assert reached["server"] == "done", reached
    assert reached["parent"] in reached["others"], reached
    assert_holds_nothing_of_its_servers(reached)  # not the sandbox's doing: what it is handed, at any level


async def test_instances_start_beside_the_machines_own_mounts_under_tmp(tmp_path: Path) -> None:
    """A confined instance mounts again, in a /tmp of its own, what its template's sandbox mounted under /tmp (the
    bundle, the venv, when they live there). The machine's own mounts there (another program's tmpfs, a build's
    chroot, as mmdebstrap makes one) are listed too, but out of reach under the sandbox's /tmp: left out, not a
    start that fails (every start failed, and a strict server refused to start). One unmounted while the server
    runs changes nothing either."""
    bundle = make_bundle(tmp_path / "bundles")
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="process")).path
    passing = Path(tempfile.mkdtemp(prefix="gymhost-test-passing-mount-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(passing)], check=True)
    try:
        with serving(gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict")) as server:
            async with EpisodeClient(server.url) as episode:  # the instance started while it was there
                await episode.seed(rows(folder)[0])
                assert (await episode.verify(rows(folder)[0]))["reward"] is not None
            subprocess.run(["umount", str(passing)], check=True)
            passing.rmdir()
            for row in rows(folder)[:2]:  # each on a fresh instance, started since
                async with EpisodeClient(server.url) as episode:
                    await episode.seed(row)
                    assert (await episode.call_tool("increment")).ok
                    assert (await episode.verify(row))["reward"] is not None
            assert "could not confine itself" not in server.output, server.output
    finally:
        subprocess.run(["umount", str(passing)], check=False, capture_output=True)
        shutil.rmtree(passing, ignore_errors=True)


async def test_strict_refuses_to_start_where_instances_cannot_be_confined_and_auto_says_so(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundles")
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="process")).path
    strict = gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict")
    done = run_to_completion(without_user_namespaces(strict))
    assert done.returncode == 1, done
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("Error: --sandbox strict: hosted code cannot be confined here: "), said
    assert said.endswith("no more user namespaces may be made here (user.max_user_namespaces)"), said
    # auto: the same machine serves, its instances restricted by Landlock and seccomp, and the start line says why;
    # where Landlock is refused too, unconfined but within the instances' limits.
    for landlock, level, said in (
        (True, "landlock", "hosted code runs without namespaces, restricted by Landlock and seccomp: "),
        (False, "limits", "hosted code runs unconfined, with the server's reach, within its limits: "),
    ):
        auto = without_user_namespaces(gymhost_command("serve", str(folder), "--port", "0"), landlock=landlock)
        with serving(auto) as server:
            assert pool_status_of(server.url)["confinement"] == level
            async with EpisodeClient(server.url) as episode:
                await episode.seed(rows(folder)[0])
                assert (await episode.call_tool("increment", {"by": 2})).ok
                assert (await episode.verify(rows(folder)[0]))["reward"] == 1.0
        assert said in server.output, server.output
        assert "user.max_user_namespaces" in server.output
    assert "no Landlock in this kernel" in server.output, server.output


async def test_strict_refuses_a_bundle_served_in_process(tmp_path: Path) -> None:
    """``--sandbox strict`` means confined or no start: a bundle written in-process runs inside the server, where
    nothing confines it, so it does not start, and the error says how to run it apart. ``auto`` serves it, and says
    it cannot be confined."""
    bundle = make_bundle(tmp_path / "bundles")
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="in_process")).path
    done = run_to_completion(gymhost_command("serve", str(folder), "--port", "0", "--sandbox", "strict"))
    assert done.returncode == 1, done
    said = done.stderr.strip().splitlines()[-1]
    assert said == (
        f"Error: --sandbox strict: {folder / 'bundle'} runs in-process, inside the server, where nothing confines "
        "it: write it with --mode process"
    ), done.stderr
    with serving(gymhost_command("serve", str(folder), "--port", "0")) as server:
        async with EpisodeClient(server.url) as episode:
            await episode.seed(rows(folder)[0])
            assert (await episode.call_tool("increment")).ok
    assert "cannot be confined; write it with --mode process" in server.output, server.output


# Template code (the bundle's, imported there) that hands the server a pidfd of its own parent, not of the instance
# it forked: at the landlock level, the server itself, which would then signal itself as it retires the instance.
HANDS_OVER_ITS_PARENT = """
import os, sys

_template = sys.modules["__main__"]  # the template runs as python -m ..._template
_hand_over = _template._hand_over
_template._hand_over = lambda pidfds, pid, pidfd: _hand_over(pidfds, os.getppid(), -1)
"""


async def test_the_server_signals_no_process_its_template_did_not_start(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundles")
    folder = (await awrite_folder(str(bundle), tmp_path / "root", instances=1, mode="process")).path
    copied = folder / "bundle" / "env.py"
    copied.write_text(HANDS_OVER_ITS_PARENT + copied.read_text())
    finished = run_to_completion(without_user_namespaces(gymhost_command("serve", str(folder), "--port", "0")))
    output = finished.stdout + finished.stderr
    assert "restricted by Landlock and seccomp" in output, output
    assert finished.returncode == 1, output  # refused at its first instance, never signalling its own server
    assert re.search(r"the instance template handed over process \d+, which it did not start", output), output
