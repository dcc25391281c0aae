"""What a folder's requirements.txt asks for, read as pip reads it, and judged against what is installed
(``_hosting/_requirements``; ``gymhost requirements`` prints the unmet lines for ``pip install -r``).

An installed distribution of this test's own (a ``.dist-info`` on ``sys.path``) stands in for what a folder names,
so the judgement does not depend on the venv the tier runs in."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gymhost._hosting._requirements import requirements_of

pytestmark = pytest.mark.unit

METADATA = """Metadata-Version: 2.1
Name: gymhost-test-fake
Version: 2.0rc1
Provides-Extra: fast
Provides-Extra: light
Requires-Dist: gymhost-test-absent>=1; extra == "fast"
"""

REQUIREMENTS = """-e nemo-gym[dev] @ ../../
--extra-index-url https://example.invalid/simple
# a comment line
gymhost-test-fake>=1.0  # a pre-release, which pip takes when it is what is installed
gymhost-test-fake[light]>=1 --hash=sha256:0123
gymhost-test-fake[fast]>=1.0
gymhost-test-echo @ git+https://example.invalid/echo.git#subdirectory=envs/echo
./a/local/path
-r more.txt
"""

MORE = """gymhost-test-absent==1 \\
    --hash=sha256:4567
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    info = site / "gymhost_test_fake-2.0rc1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(METADATA)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    server = tmp_path / "echo_server"
    (server / "configs").mkdir(parents=True)
    (server / "requirements.txt").write_text(REQUIREMENTS)
    (server / "more.txt").write_text(MORE)
    return server


def test_requirements_are_read_and_judged_as_pip_would(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gymhost"):
        judged = {" ".join(requirement.line.split()): requirement.met for requirement in requirements_of(folder)}
    assert judged == {
        "gymhost-test-fake>=1.0": True,  # 2.0rc1: a pre-release allowed, as pip allows what is installed
        "gymhost-test-fake[light]>=1 --hash=sha256:0123": True,  # an extra that brings nothing
        "gymhost-test-fake[fast]>=1.0": False,  # its extra's dependency is not installed
        "gymhost-test-echo @ git+https://example.invalid/echo.git#subdirectory=envs/echo": False,  # the URL whole
        "gymhost-test-absent==1 --hash=sha256:4567": False,  # from the file -r names, its continuation joined
    }
    assert [r.args[1] for r in caplog.records if "is not checked here" in r.getMessage()] == ["./a/local/path"]


def test_gymhost_requirements_prints_what_pip_installs(folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gymhost", "requirements", str(folder)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert [" ".join(line.split()) for line in done.stdout.splitlines()] == [
        f"# echo_server ({folder})",
        "--extra-index-url https://example.invalid/simple",  # where its packages come from, first
        "gymhost-test-fake[fast]>=1.0",
        "gymhost-test-echo @ git+https://example.invalid/echo.git#subdirectory=envs/echo",
        "gymhost-test-absent==1 --hash=sha256:4567",
    ]
    assert "./a/local/path" in done.stderr  # left out, and said
