"""What a user sees with the base install only: no nemo-gym, no omegaconf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import gymhost
from gymhost import ServeError
from gymhost.cli import main

from .conftest import REPO

pytestmark = pytest.mark.unit


def test_public_api_imports_without_nemo_gym(without_nemo_gym: None) -> None:
    assert set(gymhost.__all__) <= set(dir(gymhost))
    assert callable(gymhost.create_app)


def test_the_package_says_it_is_typed() -> None:
    """PEP 561's marker, in the installed package (the wheel tier runs this against the wheel): without it, a user's
    type checker treats gymhost as untyped and misses a misspelled name."""
    import importlib.resources

    assert importlib.resources.files("gymhost").joinpath("py.typed").is_file()


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "serve" in result.output


def test_python_dash_m_runs_the_same_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gymhost", "serve", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())  # click wraps option help
    assert "--server-url NAME=URL" in help_text
    assert "Beyond loopback, set a token (GYMHOST_TOKEN or --token)" in help_text
    assert "[default: 127.0.0.1]" in help_text


def test_serve_without_nemo_gym_prints_the_install_hint(without_nemo_gym: None, tmp_path: object) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gymhost", "serve", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: nemo_gym is not installed; gymhost needs it to build resources servers: pip install nemo-gym "
        "omegaconf (or install gymhost with its extra: pip install '.[nemo-gym]' in a checkout, or "
        "pip install 'gymhost-VERSION-py3-none-any.whl[nemo-gym]' from a wheel)"
    ]
    assert "Traceback" not in result.stderr


def test_create_app_without_nemo_gym_raises_the_install_hint(without_nemo_gym: None) -> None:
    with pytest.raises(gymhost.NemoGymNotInstalledError, match=r"pip install nemo-gym omegaconf \(or install gymhost"):
        gymhost.create_app(REPO)


def test_a_bare_name_without_nemo_gym_gets_the_install_hint(without_nemo_gym: None) -> None:
    result = CliRunner().invoke(main, ["serve", "example_single_tool_call"])
    assert result.exit_code == 1
    assert result.output.startswith(
        "Error: nemo_gym (to serve the installed Gym server 'example_single_tool_call') is not installed"
    )


def test_list_and_serve_say_what_they_take() -> None:
    assert "FOLDER_OR_NAME..." in CliRunner().invoke(main, ["serve", "--help"]).output
    listed = " ".join(CliRunner().invoke(main, ["list", "--help"]).output.split())
    assert "The Gym servers nemo-gym installed (or those of a Gym ROOT)" in listed


def test_serve_takes_its_folders_from_gymhost_folder_when_given_none(tmp_path: Path) -> None:
    """As the container image runs it: no argument, GYMHOST_FOLDER names what to serve (the same check follows)."""
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(main, ["serve"], env={"GYMHOST_FOLDER": str(missing)})
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {missing}"), result.output
    nothing = CliRunner().invoke(main, ["serve"], env={"GYMHOST_FOLDER": ""})
    assert nothing.exit_code == 2
    assert "Missing argument 'FOLDER_OR_NAME...'" in nothing.output


def test_a_path_with_a_space_in_gymhost_folder_fails_saying_it_was_split(tmp_path: Path) -> None:
    spaced = tmp_path / "My Projects" / "server"
    result = CliRunner().invoke(main, ["serve"], env={"GYMHOST_FOLDER": str(spaced)})
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {tmp_path / 'My'}"), result.output
    assert result.output.strip().endswith(
        "(GYMHOST_FOLDER is split on spaces: a path with a space in it cannot be given there)"
    )
    given = CliRunner().invoke(main, ["serve", str(tmp_path / "a"), str(tmp_path / "b")], env={"GYMHOST_FOLDER": ""})
    assert given.exit_code == 1, given.output
    assert "split on spaces" not in given.output  # paths given as arguments were not split by gymhost


def test_serve_says_its_error_as_a_json_record_under_log_format_json(tmp_path: Path) -> None:
    """Under ``--log-format json`` the line a failed start ends with is JSON too: a log shipper reads it as it reads
    the rest."""
    missing = tmp_path / "missing"
    result = CliRunner().invoke(main, ["serve", str(missing), "--log-format", "json"])
    assert result.exit_code == 1, result.output
    (line,) = result.output.splitlines()
    record = json.loads(line)
    assert (record["level"], record["logger"]) == ("ERROR", "gymhost"), record
    assert record["message"].startswith(f"{missing}: no such folder"), record
    text = CliRunner().invoke(main, ["serve", str(missing)])
    assert text.output.startswith(f"Error: {missing}: no such folder"), text.output


def test_server_url_must_be_name_equals_url() -> None:
    result = CliRunner().invoke(main, ["serve", ".", "--server-url", "judge"])
    assert result.exit_code == 2
    assert "expected NAME=VALUE, got 'judge'" in result.output


@pytest.mark.parametrize("value", ["", "   "])
def test_asgi_module_without_folder_variable_exits_with_one_line(value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import asgi"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={"GYMHOST_FOLDER": value, "PATH": ""},
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("gymhost: GYMHOST_FOLDER is not set; set it to a resources-server folder")
    assert "Traceback" not in result.stderr


def test_secret_settings_read_are_gone_from_what_other_processes_can_read() -> None:
    """``/proc/PID/environ`` shows every process of the user the environment as it was at ``exec``, whatever
    ``unsetenv`` did since: gymhost overwrites the secret values there too as it takes them."""
    code = (
        "import os; from gymhost._config import take_secrets; take_secrets(); "
        "block = open('/proc/self/environ', 'rb').read(); "
        "print(b'keep-me-hidden' in block, b'the-token' in block, 'GYMHOST_SECRET' in os.environ, b'KEPT=1' in block)"
    )
    env = {**os.environ, "GYMHOST_SECRET": "keep-me-hidden", "GYMHOST_TOKEN": "the-token", "KEPT": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False", "False", "True"], done.stdout + done.stderr


def test_a_serve_config_made_in_python_reads_the_token_as_the_command_line_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Server(ServeConfig(...)).run()`` and ``asgi:app`` guard their apps with GYMHOST_TOKEN, as gymhost serve does
    (a test of the base install: ServeConfig builds its settings without nemo-gym)."""
    from gymhost import ServeConfig

    monkeypatch.setenv("GYMHOST_TOKEN", "from-the-environment")
    assert ServeConfig().app.token == "from-the-environment"
    assert "GYMHOST_TOKEN" not in os.environ, "read, and taken out of the environment nothing hosted may read"
    assert ServeConfig().app.token == "from-the-environment", "kept for the life of the process"
    monkeypatch.setenv("GYMHOST_TOKEN", "")  # set again, empty: unset
    assert ServeConfig().app.token is None
    monkeypatch.setenv("GYMHOST_DRAIN_TIMEOUT", "300")
    assert ServeConfig().drain_timeout == 300
    monkeypatch.setenv("GYMHOST_DRAIN_TIMEOUT", "-5")
    with pytest.raises(ServeError, match=r"GYMHOST_DRAIN_TIMEOUT is '-5'; expected a whole number of seconds"):
        ServeConfig()
    monkeypatch.delenv("GYMHOST_DRAIN_TIMEOUT")
    assert ServeConfig().drain_timeout == 120


def test_the_reference_names_every_variable_hosted_code_is_given() -> None:
    """docs/reference/cli.md lists the allow-list a process of hosted code starts with: the code's list, in full."""
    from gymhost._confinement import PASSED

    reference = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert not [name for name in sorted(PASSED) if f"`{name}`" not in reference]


@pytest.mark.parametrize(("typed", "nearest"), [("foo", None), ("serv", "serve"), ("lsit", "list"), ("tpo", "top")])
def test_a_mistyped_command_says_so_and_exits_2(typed: str, nearest: str | None) -> None:
    result = CliRunner().invoke(main, [typed, "--help"])
    assert result.exit_code == 2, result.output
    assert f"No such command '{typed}'" in result.output
    assert "Write ROOT/resources_servers" not in result.output  # not write's help
    if nearest is not None:
        assert f"Did you mean '{nearest}'" in result.output


def test_a_source_as_the_first_argument_still_runs_write(tmp_path: Path) -> None:
    """An existing folder, a path that does not exist, a URL, or write's options first: all go to write, whose own
    errors say what is wrong with them."""
    folder = tmp_path / "bundle"
    folder.mkdir()
    for first in ([str(folder)], [str(tmp_path / "missing")], ["./missing"], ["http://127.0.0.1:9/"], ["--name", "x"]):
        result = CliRunner().invoke(main, [*first, "--help"])
        assert result.exit_code == 0, (first, result.output)
        assert "Write ROOT/resources_servers" in result.output, (first, result.output)
