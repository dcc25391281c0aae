"""`gymhost write` without nemo-gym: what it writes from a bundle and from URLs, and what it refuses."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
from pathlib import Path

import pytest

from gymhost.environments import CatalogError, SourceError, TaskError, WriteError, write_folder
from gymhost.environments._backend import Catalog
from gymhost.environments._catalog import server_tools

from .agentenv_helpers import COUNTER_TASK, GRIDSIM, copy_gridsim, environment_process, make_bundle, rows
from .conftest import REPO
from .processes import run_to_completion

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    return write_folder(str(GRIDSIM), root).path


def test_writing_needs_neither_nemo_gym_nor_omegaconf(without_nemo_gym: None, written: Path) -> None:
    assert written.is_dir()


def test_the_folder_is_a_gym_resources_server_folder(written: Path) -> None:
    assert written.name == "gridsim_v1"
    assert written.parent.name == "resources_servers"
    files = {str(p.relative_to(written)) for p in written.rglob("*") if p.is_file()}
    assert files == {
        "app.py",
        "configs/gridsim_v1.yaml",
        "configs/gridsim_v1_environment_server.yaml",
        "data/eval.jsonl",
        "requirements.txt",
        "README.md",
        "bundle/env.py",
        "bundle/README.md",
        "bundle/tasks/eval.jsonl",
    }
    compile((written / "app.py").read_text(), "app.py", "exec")
    assert "class GridsimV1ResourcesServer(WrittenResourcesServer):" in (written / "app.py").read_text()
    assert (
        'if __name__ == "__main__":\n    GridsimV1ResourcesServer.run_webserver()' in (written / "app.py").read_text()
    )
    # gymhost as it was installed here (PEP 610): this checkout, or the wheel the wheel tier installed, so that Gym's
    # launcher can build the server's venv from the same gymhost.
    installed = json.loads(importlib.metadata.distribution("gymhost").read_text("direct_url.json") or "{}")
    expected = REPO.as_uri() if installed.get("dir_info", {}).get("editable") else installed["url"]
    assert (written / "requirements.txt").read_text().splitlines()[0] == f"gymhost[nemo-gym] @ {expected}"


def test_the_config_has_the_server_an_agent_and_an_environment_server(written: Path) -> None:
    """The environment server (nemo-gym 0.7.0's) in a file of its own: 0.4.0's launcher refuses the block."""
    config = (written / "configs" / "gridsim_v1.yaml").read_text()
    environment_server = (written / "configs" / "gridsim_v1_environment_server.yaml").read_text()
    assert "gridsim_v1_environment_server:\n  environment_servers:\n    legacy_agent:" in environment_server
    assert "environment_servers" not in config
    for line in [
        "gridsim_v1_resources_server:\n  resources_servers:\n    gridsim_v1:\n      entrypoint: app.py",
        '      environment: "gridsim"',
        "        kind: bundle\n        path: bundle\n        mode: process\n        instances: 4",
        '      tasks: "bundle/tasks"',
        "gridsim_v1_simple_agent:\n  responses_api_agents:\n    simple_agent:",
        "        name: gridsim_v1_resources_server",
        '        license: "TBD"',  # Gym refuses a train or validation dataset without one
        '        jsonl_fpath: "resources_servers/gridsim_v1/data/eval.jsonl"',
    ]:
        assert line in config


def test_one_row_per_task_with_prompt_tools_and_task_id(written: Path) -> None:
    tasks = [json.loads(line) for line in (GRIDSIM / "tasks" / "eval.jsonl").read_text().splitlines()]
    written_rows = rows(written)
    assert [row["task_id"] for row in written_rows] == [task["id"] for task in tasks]
    first = written_rows[0]
    assert first["split"] == "eval"
    assert first["agent_ref"] == {"type": "responses_api_agents", "name": "gridsim_v1_simple_agent"}
    assert first["responses_create_params"]["input"] == [
        {"role": "system", "content": tasks[0]["prompt"]["system"]},
        {"role": "user", "content": tasks[0]["prompt"]["user"]},
    ]
    move = {tool["name"]: tool for tool in first["responses_create_params"]["tools"]}["gridsim_move"]
    assert move["type"] == "function"
    assert move["strict"] is False
    assert move["parameters"]["properties"]["direction"]["enum"] == ["up", "down", "left", "right"]


def test_rewriting_is_refused_without_force(written: Path) -> None:
    with pytest.raises(WriteError, match=r"gridsim_v1: already exists; pass --force to replace it"):
        write_folder(str(GRIDSIM), written.parent.parent)


def test_force_replaces_the_whole_folder(tmp_path: Path) -> None:
    first = write_folder(str(GRIDSIM), tmp_path).path
    (first / "stale.txt").write_text("left over")
    again = write_folder(str(GRIDSIM), tmp_path, force=True, instances=2, mode="in-process").path
    assert again == first
    assert not (again / "stale.txt").exists()
    assert "        mode: in_process\n        instances: 2" in (again / "configs" / "gridsim_v1.yaml").read_text()
    assert sorted(p.name for p in again.parent.iterdir()) == ["gridsim_v1"]  # no scratch folders left behind


def test_a_bundle_is_copied_so_the_folder_outlives_it(tmp_path: Path) -> None:
    bundle = copy_gridsim(tmp_path / "src")
    folder = write_folder(str(bundle), tmp_path / "root").path
    shutil.rmtree(bundle)
    assert (folder / "bundle" / "env.py").read_text() == (GRIDSIM / "env.py").read_text()


def test_hidden_tools_are_left_out_of_the_rows(tmp_path: Path) -> None:
    folder = write_folder(str(make_bundle(tmp_path)), tmp_path / "root").path
    assert [tool["name"] for tool in rows(folder)[0]["responses_create_params"]["tools"]] == ["increment", "stall"]


def test_a_solution_calling_a_hidden_tool_is_refused(tmp_path: Path) -> None:
    task = {**COUNTER_TASK, "solution": {"tool_calls": [{"name": "peek_answers"}]}}
    bundle = make_bundle(tmp_path, tasks=[task])
    with pytest.raises(CatalogError, match=r"its solution calls 'peek_answers', which the environment hides"):
        write_folder(str(bundle), tmp_path / "root")


def test_a_solution_calling_an_unknown_tool_is_refused(tmp_path: Path) -> None:
    task = {**COUNTER_TASK, "solution": {"tool_calls": [{"name": "decrement"}]}}
    bundle = make_bundle(tmp_path, tasks=[task])
    with pytest.raises(CatalogError, match=r"eval\.jsonl: task 'count-to-3': its solution calls 'decrement'"):
        write_folder(str(bundle), tmp_path / "root")


def test_a_grade_extension_missing_from_the_card_is_refused(tmp_path: Path) -> None:
    task = {**COUNTER_TASK, "grading": {"criteria": [{"kind": "extension", "uri": "urn:counter:grade/v1"}]}}
    with pytest.raises(CatalogError, match=r"grades with extension urn:counter:grade/v1, which environment 'counter'"):
        write_folder(str(make_bundle(tmp_path, tasks=[task])), tmp_path / "root")


def test_a_tool_named_like_a_gym_route_is_refused(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, tool_name="verify")
    with pytest.raises(CatalogError, match=r"tool 'verify' clashes with Gym's own /verify route"):
        write_folder(str(bundle), tmp_path / "root")


def test_a_tool_whose_schema_json_cannot_carry_is_refused(tmp_path: Path) -> None:
    """A NaN default in a tool's input schema: it would reach every row's ``tools`` as ``NaN`` (not JSON) and make
    the server's OpenAPI document a 500."""
    bundle = make_bundle(tmp_path)
    env = bundle / "env.py"
    env.write_text(env.read_text().replace("by: int = 1", 'by: float = float("nan")'))
    with pytest.raises(CatalogError, match=r"tool 'increment': its description or input schema is not JSON a client"):
        write_folder(str(bundle), tmp_path / "root")


def test_a_tool_whose_text_utf8_cannot_carry_is_refused() -> None:
    """A lone surrogate in a description (only hosted code that writes its own answers can send one): escaped, it
    would pass and fail later, in /openapi.json and in every client that sends a row's tools as UTF-8."""
    tool = {"name": "move", "description": "to caf\udce9", "inputSchema": {}}
    with pytest.raises(CatalogError, match=r"tool 'move': its description or input schema is not JSON a client"):
        server_tools(Catalog("counter", tools=(tool,)), [])


def test_a_card_past_its_bound_is_refused(tmp_path: Path) -> None:
    """The card is hosted code's; the server keeps it and copies from it: a few kilobytes honestly, at most 1 MiB."""
    bundle = make_bundle(tmp_path)
    env = bundle / "env.py"
    env.write_text(env.read_text().replace('@tool(name="stall")', '@tool(name="stall", description="x" * 2_000_000)'))
    with pytest.raises(CatalogError, match=r"environment 'counter': its card is 2,\d\d\d,\d\d\d characters of JSON"):
        write_folder(str(bundle), tmp_path / "root")


def test_a_malformed_task_names_file_line_and_field(tmp_path: Path) -> None:
    bundle = make_bundle(
        tmp_path, tasks=[COUNTER_TASK, {**COUNTER_TASK, "id": "two", "grading": {"criteria": [{"kind": "state"}]}}]
    )
    with pytest.raises(TaskError, match=r"tasks/eval\.jsonl:2: grading\.criteria\.0\.path: Field required"):
        write_folder(str(bundle), tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_sources_that_are_not_there(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"nowhere: not an http\(s\) URL and no such folder"):
        write_folder(str(tmp_path / "nowhere"), tmp_path / "root")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"empty: no env\.py; a bundle holds one AgentEnvEnvironment subclass"):
        write_folder(str(tmp_path / "empty"), tmp_path / "root")
    with pytest.raises(SourceError, match=r"http://127\.0\.0\.1:9: nothing answered: ConnectError"):
        write_folder("http://127.0.0.1:9", tmp_path / "root")
    tasks = GRIDSIM / "tasks" / "eval.jsonl"
    with pytest.raises(SourceError, match=r"http://127\.0\.0\.1:9: no environment card answered"):
        write_folder("http://127.0.0.1:9", tmp_path / "root", tasks_file=tasks)


def test_a_bad_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match=r"--name 'Grid-Sim': expected lower-case letters"):
        write_folder(str(GRIDSIM), tmp_path, name="Grid-Sim")


def test_url_source_writes_urls_and_copies_the_tasks(tmp_path: Path) -> None:
    tasks = GRIDSIM / "tasks" / "eval.jsonl"
    with environment_process() as first, environment_process() as second:
        written = write_folder(first.url, tmp_path, tasks_file=tasks, urls=[second.url])
    assert written.path.name == "gridsim"  # named after the card
    config = (written.path / "configs" / "gridsim.yaml").read_text()
    assert f'        kind: urls\n        urls:\n        - "{first.url}"\n        - "{second.url}"' in config
    assert (written.path / "tasks" / "eval.jsonl").read_text() == tasks.read_text()
    assert len(rows(written.path)) == len(tasks.read_text().splitlines())


def test_the_cli_routes_a_source_to_write(tmp_path: Path) -> None:
    result = run_to_completion([sys.executable, "-m", "gymhost", str(GRIDSIM), str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"gymhost: wrote {tmp_path}/resources_servers/gridsim_v1 (environment 'gridsim'")
    result = run_to_completion([sys.executable, "-m", "gymhost", "--name", "grid_b", str(GRIDSIM), str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "resources_servers" / "grid_b" / "configs" / "grid_b.yaml").is_file()
    again = run_to_completion([sys.executable, "-m", "gymhost", str(GRIDSIM), str(tmp_path)])
    assert again.returncode == 1
    assert (
        again.stderr.strip()
        == f"Error: {tmp_path}/resources_servers/gridsim_v1: already exists; pass --force to replace it"
    )


def test_help_lists_every_command() -> None:
    result = run_to_completion([sys.executable, "-m", "gymhost", "--help"])
    assert result.returncode == 0
    commands = result.stdout.split("Commands:")[1].split()
    assert {"serve", "write", "check"} <= set(commands)
