"""The image, run as deploy/kubernetes/gymhost.yaml's Deployment runs it, and played through by the real client.

`make test-container` builds the image (`make image`) and names it in GYMHOST_IMAGE. Every container here gets what
the Deployment gives its pods, read from the manifest: its args and environment (the pod IP is 127.0.0.1, the token
and secret this test's), its user, a read-only root file system with an emptyDir at /tmp, the ConfigMap's env.yaml at
its working directory, its cpu and memory limits, no capabilities. What a pod has that podman cannot give here: its own
network (the containers share the host's, so each listens on a free port instead of 8000) and an open-files limit
above this machine's hard one (a container may not raise it).

The folders are a written one (the gridsim bundle) and one of Gym's (example_single_tool_call), in one Gym root behind
one address: baked into the image the manifest names by deploy/container/Containerfile.folders, or mounted at run
time into the plain image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient

from .agentenv_helpers import GRIDSIM, reach_corner
from .deployment import confined_deployment, manifest, seccomp_profile
from .processes import CALL_TIMEOUT_S, free_port
from .test_verifiers import assert_scored, evaluating

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.container, pytest.mark.usefixtures("clean_env")]

REPO = Path(__file__).resolve().parent.parent
FOLDERS_CONTAINERFILE = REPO / "deploy" / "container" / "Containerfile.folders"
PODMAN = ["podman", "--runtime", "runc"]
TOKEN = "container-tier-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
WEATHER = "example_single_tool_call"
LACKED = "tomli-w>=1.0"  # a small package gymhost's image does not hold
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
GRIDSIM_NAME = GRIDSIM.name  # the written folder's name, its prefix


def image() -> str:
    found = os.environ.get("GYMHOST_IMAGE")
    if not found or subprocess.run([*PODMAN, "image", "exists", found], check=False).returncode != 0:
        pytest.fail("GYMHOST_IMAGE must name the image make image built (make test-container builds it)")
    return found


@dataclass
class Container:
    name: str
    url: str

    def logs(self) -> str:
        done = subprocess.run([*PODMAN, "logs", self.name], capture_output=True, text=True, check=False)
        return done.stdout + done.stderr

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PODMAN, "exec", self.name, *command], capture_output=True, text=True, check=False)

    def exit_code(self) -> int:
        done = subprocess.run(
            [*PODMAN, "inspect", self.name, "--format", "{{.State.ExitCode}}"], capture_output=True, text=True
        )
        return int(done.stdout.strip())


def host_limits() -> list[str]:
    """A container here may not raise its limits above the caller's hard ones (podman's defaults would)."""
    hard = int(subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True, text=True, check=True).stdout)
    return ["--ulimit", f"nofile={hard}:{hard}", "--ulimit", "nproc=4096:4096"]


def as_the_deployment_runs_it(
    work: Path, port: int, deployment: dict[str, Any] | None = None
) -> tuple[list[str], list[str]]:
    """podman's options and the image's arguments for a pod of ``deployment`` (the manifest's), on ``port``."""
    deployment = deployment if deployment is not None else manifest("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (spec,) = pod["containers"]
    options = [
        "--network",
        "host",
        "--user",
        f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}",
    ]
    security = spec["securityContext"]
    if security["readOnlyRootFilesystem"]:
        options += ["--read-only", "--read-only-tmpfs=false"]
    if "ALL" in security["capabilities"]["drop"]:
        options += ["--cap-drop", "ALL"]
    if not security["allowPrivilegeEscalation"]:
        options += ["--security-opt", "no-new-privileges"]
    if security.get("procMount") == "Unmasked":
        options += ["--security-opt", "unmask=ALL"]
    profile = seccomp_profile(deployment)  # None: RuntimeDefault, podman's own default profile
    if profile is not None:
        options += ["--security-opt", f"seccomp={profile}"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in spec["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            options += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777"]
        else:  # the ConfigMap, its keys as files
            data = manifest("ConfigMap")
            assert volume["configMap"]["name"] == data["metadata"]["name"]
            folder = work / mount["name"]
            folder.mkdir()
            for key, value in data["data"].items():
                (folder / key).write_text(value)
            options += ["-v", f"{folder}:{mount['mountPath']}:ro"]
    options += ["--workdir", spec["workingDir"]]
    limits = spec["resources"]["limits"]
    options += ["--cpus", str(min(float(limits["cpu"]), os.cpu_count() or 1))]
    options += ["--memory", limits["memory"].replace("Gi", "g").replace("Mi", "m")]
    options += host_limits()
    values = {"POD_IP": "127.0.0.1", "GYMHOST_REPLICA_ID": f"gymhost-{port}"}
    values |= {"GYMHOST_SECRET": uuid.uuid4().hex, "GYMHOST_TOKEN": TOKEN}
    for variable in spec["env"]:
        if "value" in variable:
            options += ["-e", f"{variable['name']}={variable['value']}"]
            continue
        assert variable["name"] in values, f"the test does not know how to give {variable['name']}"
        options += ["-e", f"{variable['name']}={values[variable['name']]}"]
    arguments = [re.sub(r"\$\((\w+)\)", lambda found: values[found.group(1)], arg) for arg in spec["args"]]
    arguments = [arg.replace(":8000", f":{port}") for arg in arguments]  # the host's network: a port of its own
    return options, [*arguments, f"--port={port}"]


@contextmanager
def running(
    image_name: str,
    work: Path,
    *,
    extra: tuple[str, ...] = (),
    arguments: tuple[str, ...] = (),
    deployment: dict[str, Any] | None = None,
) -> Iterator[Container]:
    """A container of ``image_name``, as ``deployment`` (the manifest's) runs it, ready (its readiness probe answers
    200)."""
    port = free_port()
    options, deployment_arguments = as_the_deployment_runs_it(work, port, deployment)
    name = f"gymhost-test-{uuid.uuid4().hex[:8]}"
    command = [*PODMAN, "run", "-d", "--name", name, *options, *extra, image_name, *arguments, *deployment_arguments]
    subprocess.run(command, check=True, capture_output=True)
    container = Container(name, f"http://127.0.0.1:{port}")
    try:
        probe = manifest("Deployment")["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{container.url}{probe['path']}", timeout=CALL_TIMEOUT_S).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            state = subprocess.run(
                [*PODMAN, "inspect", name, "--format", "{{.State.Running}}"], capture_output=True, text=True
            ).stdout.strip()
            assert state == "true", f"the container stopped before it was ready:\n{container.logs()}"
            assert time.monotonic() < deadline, f"not ready after 180 s:\n{container.logs()}"
            time.sleep(0.2)
        yield container
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, gym_root: Path) -> Path:
    """A Gym root with a written folder (the gridsim bundle) and one of Gym's own servers, whose requirements.txt
    names a package the image lacks (as a folder served with ``--venv`` outside a pod would)."""
    from gymhost.environments import write_folder

    root = tmp_path_factory.mktemp("context") / "root"
    write_folder(str(GRIDSIM), root)
    weather = Path(shutil.copytree(gym_root / WEATHER, root / "resources_servers" / WEATHER))
    with (weather / "requirements.txt").open("a") as requirements:
        requirements.write(f"\n{LACKED}\n")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)  # mounted, it is read by the image's user
    return root


@pytest.fixture(scope="module")
def envs_image(root: Path) -> Iterator[str]:
    """The image the manifest names: gymhost's, with the root baked in by Containerfile.folders."""
    name = manifest("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    done = bake(root, name)
    assert done.returncode == 0, done.stdout + done.stderr
    yield name
    subprocess.run([*PODMAN, "rmi", "-f", name], capture_output=True, check=False)


def bake(folders: Path, name: str) -> subprocess.CompletedProcess[str]:
    """``Containerfile.folders`` on gymhost's image, with ``folders`` (under the build context, its parent)."""
    # The package index reached as make image reaches it (Containerfile.folders installs what the image lacks).
    lend = ["-v", f"{HOST_CA}:{HOST_CA}:ro"] if Path(HOST_CA).is_file() else []
    build = [*PODMAN, "build", "--quiet", *lend, "-f", str(FOLDERS_CONTAINERFILE), "--build-arg", f"IMAGE={image()}"]
    build += ["--build-arg", f"FOLDERS={folders.name}", "-t", name, str(folders.parent)]
    return subprocess.run(build, capture_output=True, text=True, check=False)


def test_a_folder_whose_requirements_break_what_serving_imports_is_not_baked(gym_root: Path, tmp_path: Path) -> None:
    """A folder pinning a version of a package the image serves with (an old Starlette): the bake installs it, finds
    serving no longer imports, and fails saying so, instead of an image that fails at its first start."""
    folder = Path(shutil.copytree(gym_root / WEATHER, tmp_path / "context" / "pinned"))
    (folder / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\nstarlette==0.20.0\n")
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    name = f"gymhost-test-pinned:{uuid.uuid4().hex[:8]}"
    try:
        done = bake(folder, name)
    finally:
        subprocess.run([*PODMAN, "rmi", "-f", name], capture_output=True, check=False)
    assert done.returncode != 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "the folders' requirements broke what serving imports (above)" in said, said


def gridsim_play(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The written gridsim folder's reach-corner row and the tool calls of its reference solution."""
    return reach_corner(root / "resources_servers" / GRIDSIM_NAME)


async def play_to_the_corner(url: str, row: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One episode of the written gridsim folder at ``url``, played by its reference solution: the verdict."""
    async with EpisodeClient(url, token=TOKEN) as episode:
        await episode.seed(row)
        for step in steps:
            assert (await episode.call_tool(step["name"], step["arguments"])).ok
        return await episode.verify(row, "I am at (1, 1).")


def test_the_image_the_manifest_names_serves_a_written_folder_and_gyms_behind_one_address_to_vf_eval(
    envs_image: str, root: Path, gym_root: Path, tmp_path: Path
) -> None:
    with running(envs_image, tmp_path) as container:
        status = container.exec("cat", "/proc/1/status").stdout
        assert re.search(r"^Uid:\s+10001\s", status, re.MULTILINE), status  # not root
        assert container.exec("touch", "/opt/gymhost/written").returncode != 0  # the root file system is read-only
        # What the baked folders need beyond the image was installed as it was built: nothing left to install.
        assert container.exec("python", "-c", f"import {LACKED.split('>=')[0].replace('-', '_')}").returncode == 0
        assert container.exec("gymhost", "requirements", "/srv/gym").stdout == ""
        assert (
            httpx.get(f"{container.url}/livez", timeout=CALL_TIMEOUT_S).status_code == 200
        )  # the liveness probe needs no token
        assert httpx.get(container.url, timeout=CALL_TIMEOUT_S).status_code == 401  # everything else does
        listed = httpx.get(container.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=CALL_TIMEOUT_S).json()
        assert sorted(server["prefix"] for server in listed["servers"]) == sorted([f"/{GRIDSIM_NAME}", f"/{WEATHER}"])
        working_directory = manifest("Deployment")["spec"]["template"]["spec"]["containers"][0]["workingDir"]
        assert f"read {working_directory}/env.yaml (policy_base_url)" in container.logs()  # the ConfigMap's
        # As the manifest runs it, a pod's /proc is masked (procMount: Default; podman masks it too): bwrap cannot
        # mount its own, and auto restricts the instances with Landlock and seccomp instead, saying so
        # (docs/security.md, "In a container or a pod").
        pool = httpx.get(f"{container.url}/{GRIDSIM_NAME}/agentenv/pool", headers=AUTH, timeout=CALL_TIMEOUT_S)
        assert pool.json()["confinement"] == "landlock", pool.text
        said = "hosted code runs without namespaces, restricted by Landlock and seccomp: "
        assert said in container.logs(), container.logs()

        row, steps = gridsim_play(root)
        script = {"steps": steps, "final": "I am at (1, 1)."}
        with evaluating(
            f"{container.url}/{GRIDSIM_NAME}", [row], script, tmp_path / "gridsim", token=TOKEN
        ) as evaluation:
            (trace,) = evaluation.traces()
        assert_scored(trace, 1.0)

        weather_row = json.loads((gym_root / WEATHER / "data" / "example.jsonl").read_text().splitlines()[0])
        script = {"steps": [{"name": "get_weather", "arguments": {"city": "San Francisco"}}], "final": "It is cold."}
        with evaluating(
            f"{container.url}/{WEATHER}", [weather_row], script, tmp_path / "weather", token=TOKEN
        ) as evaluation:
            (trace,) = evaluation.traces()
        assert_scored(trace, 1.0)


# Run in the image: for each module named, whether it has bytecode (what pip compiled at build), so a start reads it
# rather than compiling it, as the image's PYTHONDONTWRITEBYTECODE and read-only root file system make it do each time.
_BYTECODE_CHECK = """
import importlib.util, json, os, sys
checked, missing, failed = 0, [], []
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # its package is not installed: an optional import that failed at the start
        continue
    except Exception as error:
        failed.append(f"{name}: {error!r}")
        continue
    if spec is not None and spec.origin and spec.origin.endswith(".py") and spec.cached:
        checked += 1
        if not os.path.exists(spec.cached):
            missing.append(f"{name} ({spec.origin})")
print(json.dumps({"checked": checked, "missing": missing, "failed": failed}))
"""
# What a process instance's template imports, as it does before its first fork: its own modules, the bundle's
# environment constructed. Its log never shows them (hosted code gets an allow-listed environment, without
# PYTHONPROFILEIMPORTTIME), so they are imported here, in the image, the same way.
_TEMPLATE_IMPORTS = """
import sys
from pathlib import Path
from gymhost.environments._agentenv import _construct_once, _immortal, _rehearsal, _template
from gymhost.environments._agentenv._launchers import construct, load_environment_class
_template._preload()
construct(load_environment_class(Path(sys.argv[1])))
"""
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", re.MULTILINE)


@pytest.mark.anyio
async def test_every_module_a_server_imports_in_the_image_has_its_bytecode(tmp_path: Path) -> None:
    """The image leaves out the bytecode of what no server imports (deploy/container/Containerfile: tests, pip,
    Pygments, nemo-gym's benchmarks): as the manifest runs it (two workers), serving a Gym server by name and a
    written folder in-process through an episode, and a process instance's template's imports, every module imported
    has its bytecode in the image."""
    from gymhost.environments import awrite_folder

    root = tmp_path / "in-process"
    await awrite_folder(str(GRIDSIM), root, mode="in_process")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    mounted = f"/srv/gym/resources_servers/{GRIDSIM_NAME}"
    extra = ("-v", f"{root}:/srv/gym:ro", "-e", "PYTHONPROFILEIMPORTTIME=1")
    row, steps = gridsim_play(root)
    with running(image(), tmp_path, extra=extra, arguments=(WEATHER, mounted)) as container:
        answer = await play_to_the_corner(f"{container.url}/{GRIDSIM_NAME}", row, steps)
        assert answer["reward"] == 1.0, answer
        template = container.exec("python", "-X", "importtime", "-c", _TEMPLATE_IMPORTS, f"{mounted}/bundle")
        assert template.returncode == 0, template.stderr
        names = sorted(set(_IMPORTED.findall(container.logs() + template.stderr)))
        for name in ("gymhost.environments._agentenv._launchers", "gymhost.environments._agentenv._channel", "fastapi"):
            assert name in names, names
        done = container.exec("python", "-c", _BYTECODE_CHECK, *names)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["checked"] > 1000, found  # gymhost's, nemo-gym's, their dependencies' and the standard library's
    assert found["missing"] == [], found
    assert found["failed"] == [], found


@pytest.mark.anyio
async def test_the_image_confines_its_instances_as_the_confined_overlay_runs_it(root: Path, tmp_path: Path) -> None:
    """deploy/kubernetes/confined's pod (uid 10001, read-only root, no capabilities, no new privileges; /proc
    unmasked, podman's ``unmask=ALL`` for ``procMount: Unmasked``; the shipped seccomp profile; ``--sandbox
    strict``): the image's bwrap confines each instance in namespaces, the pool says so, and an episode plays to its
    reward."""
    folder = root / "resources_servers" / GRIDSIM_NAME
    extra = ("-v", f"{folder}:/srv/gym:ro", "-e", "GYMHOST_FOLDER=/srv/gym")
    row, steps = gridsim_play(root)
    with running(image(), tmp_path, extra=extra, deployment=confined_deployment()) as container:
        pool = httpx.get(f"{container.url}/agentenv/pool", headers=AUTH, timeout=CALL_TIMEOUT_S)
        assert pool.json()["confinement"] == "namespaces", pool.text
        assert re.search(r"hosted code confinement: namespaces \(.* as uid 10001\)", container.logs()), container.logs()
        answer = await play_to_the_corner(container.url, row, steps)
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer


def test_the_image_refuses_to_start_without_a_token_or_on_a_folder_its_user_cannot_read(
    root: Path, tmp_path: Path
) -> None:
    def start(*options: str, arguments: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        command = [*PODMAN, "run", "--rm", "--network", "host", *host_limits(), *options, image(), *arguments]
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)

    no_token = start(arguments=(WEATHER,))
    assert no_token.returncode == 1, no_token.stdout + no_token.stderr
    assert "Error: serving on 0.0.0.0 with no token" in no_token.stderr, no_token.stderr
    private = tmp_path / "private"
    shutil.copytree(root / "resources_servers" / GRIDSIM_NAME, private)
    private.chmod(0o700)
    unreadable = start("-e", f"GYMHOST_TOKEN={TOKEN}", "-v", f"{private}:/srv/gym:ro", "-e", "GYMHOST_FOLDER=/srv/gym")
    assert unreadable.returncode == 1, unreadable.stdout + unreadable.stderr
    assert unreadable.stderr.strip() == (
        "Error: /srv/gym: this process (uid 10001) cannot read it; make it readable to that user (chmod -R a+rX "
        "/srv/gym)"
    ), unreadable.stderr


@pytest.mark.anyio
async def test_podman_stop_drains_an_open_episode_within_the_grace_period(root: Path, tmp_path: Path) -> None:
    """A folder mounted at run time into the plain image. SIGTERM (podman stop, as the kubelet stops a pod) drains:
    readiness fails, no new episode is taken, the open one plays to its verdict, and the process exits on its own,
    0, before the grace period ends (else podman would have killed it: 137)."""
    grace = manifest("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    folder = root / "resources_servers" / GRIDSIM_NAME
    mount = ("-v", f"{folder}:/srv/gym:ro", "-e", "GYMHOST_FOLDER=/srv/gym")
    row, steps = gridsim_play(root)
    with running(image(), tmp_path, extra=mount) as container:
        async with EpisodeClient(container.url, token=TOKEN) as episode:
            await episode.seed(row)
            stopping = subprocess.Popen([*PODMAN, "stop", "-t", str(grace), container.name], stdout=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 60
                while httpx.get(f"{container.url}/readyz", timeout=CALL_TIMEOUT_S).status_code != 503:
                    assert time.monotonic() < deadline, "readiness never failed after SIGTERM"
                    time.sleep(0.1)
                async with EpisodeClient(container.url, token=TOKEN) as late:
                    with pytest.raises(httpx.HTTPStatusError) as refused:
                        await late.seed(row)
                    assert refused.value.response.status_code == 503
                for step in steps:
                    assert (await episode.call_tool(step["name"], step["arguments"])).ok
                verdict = await episode.verify(row, "I am at (1, 1).")
                assert verdict["reward"] == 1.0, verdict
                assert stopping.wait(grace + 30) == 0
            finally:
                if stopping.poll() is None:
                    stopping.kill()
        assert container.exit_code() == 0, container.logs()


# Run in the image as its user: what a process of the server's user (the model's code a Gym server's verify starts,
# agent-env's app) can take from each of gymhost's processes: a copy of each descriptor (``pidfd_getfd``: the listening
# socket, the trainer's connections) and their memory (``/proc/PID/mem``: the signing secret). Also from a process of
# its own, dumpable as any program it starts, so a look that can copy nothing anywhere cannot pass.
_SAME_USER_LOOK = """
import ctypes, json, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_GETFD = 438

def take(pid):
    try:
        open(f"/proc/{pid}/mem", "rb").close()
        memory = "opened"
    except OSError as error:
        memory = error.strerror
    pidfd = os.pidfd_open(pid)
    copied = []
    for fd in range(0, 64):
        got = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if got >= 0:
            copied.append(fd)
            os.close(got)
    os.close(pidfd)
    return {"memory": memory, "copied": copied}

own = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE)
found = {"own": take(own.pid)}
own.kill()
for pid in [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]:
    try:
        words = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if words[1:3] == [b"/opt/gymhost/bin/gymhost", b"serve"]:
        found[pid] = take(pid)
print(json.dumps(found))
"""


def test_code_running_as_the_servers_user_takes_nothing_of_its_processes(gym_root: Path, tmp_path: Path) -> None:
    """The plain image serving one of Gym's servers by name, as the Deployment runs it (uid 10001, two workers, the
    default sandbox, which leaves a Gym server's own process unconfined): a process of the same user, as the model's
    code a verify runs would be, can copy no descriptor of the server's supervisor or workers and cannot open their
    memory (they are not dumpable); of a process of its own it can."""
    with running(image(), tmp_path, arguments=(WEATHER,)) as container:
        done = container.exec("python", "-c", _SAME_USER_LOOK)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        own = found.pop("own")
        assert (own["memory"], own["copied"][:3]) == ("opened", [0, 1, 2]), own
        assert len(found) == 3, (found, container.exec("ps", "-ef").stdout)  # the supervisor and its two workers
        assert all(taken == {"memory": "Permission denied", "copied": []} for taken in found.values()), found


@pytest.mark.anyio
async def test_the_image_confines_a_gym_servers_own_process_as_the_confined_overlay_runs_it(
    gym_root: Path, tmp_path: Path
) -> None:
    """The same pod serving one of Gym's own servers by name, under ``--sandbox strict``: the server's own process,
    both workers, runs in bubblewrap's sandbox as the image's user, and an episode plays."""
    row = json.loads((gym_root / WEATHER / "data" / "example.jsonl").read_text().splitlines()[0])
    with running(image(), tmp_path, arguments=(WEATHER,), deployment=confined_deployment()) as container:
        logs = container.logs()
        said = r"its own code runs confined: bubblewrap .* as uid 10001; its folders read-only, a private /tmp, no net"
        assert re.search(said, logs), logs
        assert "2 workers" in logs, logs
        async with EpisodeClient(container.url, token=TOKEN) as episode:
            await episode.seed(row)
            assert (await episode.call_tool("get_weather", {"city": "San Francisco"})).ok
            verdict = await episode.verify(row, "It is cold.")
        assert "reward" in verdict, verdict
