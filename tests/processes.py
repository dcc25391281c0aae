"""Real server processes for tests: start, wait until they answer, stop with SIGTERM, keep their output."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# The start line, as text or (--log-format json) as the message of a JSON record.
URL_LINE = re.compile(r'(?:gymhost: |"message": ")serving \S+ at (http://[^\s"]+)')
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
# A test's HTTP call to a real server: a bound that catches a hang, never one a busy machine reaches (httpx's default
# of 5 s is: a first /openapi.json or a grader's first import took longer on two cores shared with other work).
CALL_TIMEOUT_S = 120.0
# A wait for a state a test names (a process gone, a pool settled, readiness flipped): the bound only ends a wait that
# would never end, so it is far past what a loaded machine takes.
STATE_TIMEOUT_S = 60.0


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        """SIGTERM, as a supervisor would; a server that ignores it is killed and the test fails."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
                raise AssertionError(f"server ignored SIGTERM for {STOP_TIMEOUT_S}s:\n{self.output}") from None
        return self.process.returncode


def assert_stopped_cleanly(server: ServerProcess) -> None:
    """Exit 0, or death by the SIGTERM we sent after a complete shutdown (uvicorn re-raises the signal it
    caught, so its exit status is -SIGTERM even when the lifespan shut down cleanly)."""
    assert server.process.returncode in (0, -signal.SIGTERM), server.output
    assert "Traceback" not in server.output, server.output


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gymhost_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gymhost", *args]


def run_to_completion(
    command: Sequence[str], *, cwd: Path | None = None, timeout: float = 120, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``env``: variables set over this process's own."""
    environment = {**os.environ, **env} if env is not None else None
    return subprocess.run(
        list(command), capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False, env=environment
    )


@contextmanager
def serving(
    command: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    url: str | None = None,
    ready_path: str = "/",
    pass_fds: Sequence[int] = (),
) -> Iterator[ServerProcess]:
    """Run ``command`` until the server answers ``GET ready_path``; its URL is ``url`` or the one gymhost prints.
    ``pass_fds``: descriptors it inherits, as from a shell or a supervisor."""
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        pass_fds=pass_fds,
        # A test stops its server with one SIGTERM: a short drain, unless the test drains on purpose (--drain-timeout).
        env={**os.environ, "GYMHOST_DRAIN_TIMEOUT": "2", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    server = ServerProcess(process, url or "")
    reader = threading.Thread(target=_collect, args=(server,), daemon=True)
    reader.start()
    try:
        _wait_until_ready(server, ready_path)
        yield server
    except BaseException as error:
        # The test failed already: its own error is the one to read, with the server's output beside it; a server
        # that then ignores SIGTERM too is only added to the note.
        try:
            server.stop()
        except AssertionError as stop_error:
            error.add_note(str(stop_error))
        else:
            error.add_note(f"server output:\n{server.output}")
        raise
    else:
        server.stop()
    finally:
        reader.join(5)


def _collect(server: ServerProcess) -> None:
    assert server.process.stdout is not None
    for line in server.process.stdout:
        server.lines.append(line)
        match = URL_LINE.search(line)
        if match and not server.url:
            server.url = match.group(1)


def _wait_until_ready(server: ServerProcess, ready_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"server exited with {server.process.returncode} before serving:\n{server.output}")
        if server.url:
            try:
                if httpx.get(f"{server.url}{ready_path}", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"server did not answer within {START_TIMEOUT_S}s:\n{server.output}")


@contextmanager
def uvicorn_in_a_thread(app: object) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 for an upstream a test needs (a judge); yields its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the upstream server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def naming(text: str) -> list[int]:
    """The processes whose command line holds ``text`` (a folder only they were given, say)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if text.encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:  # gone meanwhile
            pass
    return found


def assert_none_naming(text: str, what: str) -> None:
    """Until no process names ``text``: each goes when its parent does, so the last may take a moment."""
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while naming(text) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert naming(text) == [], f"{what} outlived what started them: {naming(text)}"


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for its parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between the open and the read
        return False


def reaped(pid: int) -> bool:
    """Gone for good: not even a zombie left for its parent (``alive`` is already false for a zombie)."""
    return not os.path.exists(f"/proc/{pid}")


def children(pid: int) -> list[int]:
    """Every process whose parent is ``pid``, zombies included (an unreaped child is a leak too)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def command_line(pid: int) -> str:
    """A process's command line, its arguments separated by NUL bytes ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def hosting(server: int, template: int) -> list[int]:
    """The processes from the one ``server`` started for its pool's template down to the template: confined, the
    sandbox's (bwrap, and the first process of the template's PID namespace) and the template; else the template."""
    chain = [template]
    while (above := parent(chain[0])) != server:
        chain.insert(0, above)
    return chain


def instance_processes(pid: int) -> list[int]:
    """An instance's process as the pool reports it, and what runs under it: confined, that is the instance's
    keeper, and under it the instance itself, first of a PID namespace of its own (``_confinement._rules``)."""
    return sorted([pid, *descendants(pid)])


def environment_process(pid: int) -> int:
    """The process that runs an instance's environment: a confined instance's keeper's one child, else ``pid``."""
    below = children(pid)
    return below[0] if below else pid


def descendants(pid: int) -> list[int]:
    """Children, their children, and so on: a pool's template process and the instances it forked."""
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return sorted(found)


def on_a_terminal(
    command: list[str], *, timeout: float = 60, env: Mapping[str, str] | None = None, status: int = 0
) -> str:
    """What ``command`` shows when its input and output are a terminal (a pseudo-terminal of this test's, 240
    columns), once it has ended with ``status`` within ``timeout``. ``env``: variables set over this process's own."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        command, stdin=terminal, stdout=terminal, stderr=terminal, env={**os.environ, "COLUMNS": "240", **(env or {})}
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([controller], [], [], max(left, 0))
            assert ready, f"{command[3:5]} did not end within {timeout} s on its terminal: {shown!r}"
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: the command is done
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(max(deadline - time.monotonic(), 1)) == status, shown
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
            process.wait()
    return shown.decode(errors="replace")


def with_read_only(folder: Path, command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own in which ``folder`` is read-only, as a pod's read-only root file
    system is (``readOnlyRootFilesystem``); the command keeps this process's PID (``unshare`` and ``sh`` exec it)."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(folder), *command]


# A user namespace of its own for the server, mapped onto the host's first 65,536 users one to one (the server is
# still root, nobody still nobody), in which no further user namespace may be made: what an administrator's
# user.max_user_namespaces=0 makes of a host.
NO_USER_NAMESPACES = """
import ctypes, errno, os, signal, sys
no_landlock = sys.argv[1] == "--no-landlock"
command = sys.argv[2:] if no_landlock else sys.argv[1:]
ready_r, ready_w = os.pipe()
mapped_r, mapped_w = os.pipe()
child = os.fork()
if child == 0:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the server goes with this wrapper, whatever ends it
    os.unshare(os.CLONE_NEWUSER)
    os.write(ready_w, b"u")
    os.read(mapped_r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0")
    if no_landlock:  # as a kernel before 5.13, or a seccomp profile older than Landlock, answers
        import pyseccomp
        refuse = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        refuse.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "landlock_create_ruleset")
        refuse.load()
    os.execv(command[0], command)
os.read(ready_r, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{child}/{name}", "w") as mapping:
        mapping.write("0 0 65536")
os.write(mapped_w, b"m")
for signum in (signal.SIGTERM, signal.SIGINT):  # what stops this wrapper stops the server, as it would stop it
    signal.signal(signum, lambda received, _: os.kill(child, received))
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def without_user_namespaces(command: list[str], *, landlock: bool = True) -> list[str]:
    """``command`` where no user namespace may be made (so bubblewrap cannot confine); ``landlock`` False: nor
    Landlock used (the kernel's answer where it has none)."""
    return [sys.executable, "-c", NO_USER_NAMESPACES, *([] if landlock else ["--no-landlock"]), *command]
