"""What a folder's requirements.txt asks for, read as pip reads it, and judged against what is installed
(``_hosting/_requirements``; ``gymhost requirements`` prints the unmet lines for ``pip install -r``).

An installed distribution of this test's own (a ``.dist-info`` on ``sys.path``) stands in for what a folder names,
so the judgement does not depend on the venv the tier runs in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gymhost._hosting._requirements import conflicts, host_extras, requirement_lines, requirements_of, unchecked

pytestmark = pytest.mark.unit

METADATA = """Metadata-Version: 2.1
Name: gymhost-test-fake
Version: 2.0rc1
Provides-Extra: fast
Provides-Extra: light
Requires-Dist: gymhost-test-absent>=1; extra == "fast"
"""

REQUIREMENTS = """-e nemo-gym[dev] @ ../../
-e ../../
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


def test_requirements_are_read_and_judged_as_pip_would(folder: Path) -> None:
    judged = {" ".join(requirement.line.split()): requirement.met for requirement in requirements_of(folder)}
    assert judged == {
        "gymhost-test-fake>=1.0": True,  # 2.0rc1: a pre-release allowed, as pip allows what is installed
        "gymhost-test-fake[light]>=1": True,  # an extra that brings nothing; its --hash is pip's
        "gymhost-test-fake[fast]>=1.0": False,  # its extra's dependency is not installed
        "gymhost-test-echo @ git+https://example.invalid/echo.git#subdirectory=envs/echo": False,  # the URL whole
        "gymhost-test-absent==1": False,  # from the file -r names, its continuation joined
    }
    assert unchecked(folder) == ["./a/local/path"]  # Gym's own line is the host, not something to judge


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
        "gymhost-test-absent==1",  # without its --hash: one hash puts pip in hash-checking mode for every line
    ]
    assert done.stderr == "gymhost: echo_server: not judged here, left out: ./a/local/path\n"


def test_lines_are_joined_and_included_as_pip_joins_them(tmp_path: Path) -> None:
    """pip's own rules (its req_file.join_lines and COMMENT_RE): a comment line continues nothing, even ending in a
    backslash, and ends a continued line; a requirement's trailing comment swallows what its backslash joins to it;
    continued lines are joined with nothing between them; a last line may end in one; -c files are named by
    absolute path, a URL as it is; an -r file that is not there (or a URL) is left as its line, for unchecked()."""
    (tmp_path / "more.txt").write_text("attrs>=1\n")
    (tmp_path / "requirements.txt").write_text(
        "# a path, C:\\\nclick>=8.\\\n0\nfoo\\\n# ends it\nrich>=1 # why \\\nswallowed==2\n-c constraints.txt\n"
        "-c https://example.invalid/c.txt\n-rmore.txt\n-r missing.txt\nhttpx>=0.1 \\"
    )
    assert list(requirement_lines(tmp_path / "requirements.txt")) == [
        "click>=8.0",
        "foo",
        "rich>=1",
        f"-c {tmp_path / 'constraints.txt'}",
        "-c https://example.invalid/c.txt",
        "attrs>=1",
        "-r missing.txt",
        "httpx>=0.1",
    ]
    (tmp_path / "configs").mkdir()
    assert unchecked(tmp_path) == ["-r missing.txt"]


def test_gyms_own_line_is_the_host_with_the_extras_it_asks_for() -> None:
    assert host_extras("-e nemo-gym[dev] @ ../../") == "[dev]"
    assert host_extras("--editable ../../[dev]") == "[dev]"
    assert host_extras("-e ../../") == ""
    assert host_extras("nemo_gym") == ""
    assert host_extras("-e ./pocketshell[pcre]") is None
    assert host_extras("nemo-gym-extras>=1") is None


def test_only_a_version_another_folder_runs_with_is_a_conflict(folder: Path, tmp_path: Path) -> None:
    """A folder needing a version that another folder's requirement is met by cannot share its process; a folder
    missing an extra's dependency, or clashing only with itself, can (it is logged, as any unmet requirement)."""

    def server(name: str, requirements: str) -> Path:
        made = tmp_path / name
        (made / "configs").mkdir(parents=True)
        (made / "requirements.txt").write_text(requirements)
        return made

    plain = server("plain", "gymhost-test-fake>=1\n")
    extra = server("extra", "gymhost-test-fake[fast]>=1\n")
    newer = server("newer", "gymhost-test-fake>=3\n")
    itself = server("itself", "gymhost-test-fake>=1\ngymhost-test-fake>=3\n")
    bare = server("bare", "gymhost-test-fake\n")
    assert conflicts({"/plain": plain, "/extra": extra}) == []
    assert conflicts({"/itself": itself}) == []
    assert conflicts({"/bare": bare, "/newer": newer}) == []  # a bare name takes the version the other needs
    (problem,) = conflicts({"/plain": plain, "/newer": newer})
    assert problem.startswith("/newer needs gymhost-test-fake>=3, but gymhost-test-fake 2.0rc1 is what /plain run with")


def test_a_version_pep_440_cannot_read_is_not_one_a_specifier_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    info = site / "gymhost_test_odd-1.0.custom.build.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gymhost-test-odd\nVersion: 1.0.custom.build\n")
    monkeypatch.syspath_prepend(str(site))
    server = tmp_path / "odd"
    (server / "configs").mkdir(parents=True)
    (server / "requirements.txt").write_text("gymhost-test-odd\ngymhost-test-odd>=1\n")
    assert [requirement.met for requirement in requirements_of(server)] == [True, False]
