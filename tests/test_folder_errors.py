"""Folders Gym's launcher would refuse: each gives an error that names the path and what was expected."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gymhost import FolderError, ServerClassError, create_app

pytestmark = [pytest.mark.nemo_gym, pytest.mark.usefixtures("clean_env")]

CONFIG = """\
{key}:
  resources_servers:
    {name}:
      entrypoint: app.py
      domain: agent
"""

SERVER = """\
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
)


class EchoConfig(BaseResourcesServerConfig):
    greeting: str = "hello"


class EchoServer(SimpleResourcesServer):
    config: EchoConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)
"""


def make_folder(root: Path, name: str = "echo", config: str | None = None, app: str | None = SERVER) -> Path:
    folder = root / name
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / f"{name}.yaml").write_text(
        config if config is not None else CONFIG.format(key=name, name=name)
    )
    if app is not None:
        (folder / "app.py").write_text(app)
    return folder


def test_a_good_folder_builds(tmp_path: Path) -> None:
    app = create_app(make_folder(tmp_path))
    assert app.state.gymhost.server.config.greeting == "hello"


def test_no_such_folder(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match=r"/missing: no such folder; expected a resources-server folder"):
        create_app(tmp_path / "missing")


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("")
    with pytest.raises(FolderError, match=r"app\.py: not a folder"):
        create_app(tmp_path / "app.py")


def test_no_configs(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    with pytest.raises(FolderError, match=r"bare/configs: no configs/\*\.yaml; expected configs/bare\.yaml"):
        create_app(tmp_path / "bare")


def test_unreadable_yaml(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, config="echo: [unclosed\n")
    with pytest.raises(FolderError, match=r"configs/echo\.yaml: not a readable YAML config"):
        create_app(folder)


def test_no_resources_server_block(tmp_path: Path) -> None:
    config = "echo_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
    folder = make_folder(tmp_path, config=config)
    with pytest.raises(FolderError, match=r"echo/configs: no resources-server block; expected a top-level key with"):
        create_app(folder)


def test_block_without_entrypoint(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, config="echo:\n  resources_servers:\n    echo:\n      domain: agent\n")
    with pytest.raises(FolderError, match=r"echo\.yaml: echo\.resources_servers\.echo has no entrypoint"):
        create_app(folder)


def test_entrypoint_file_missing(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, app=None)
    with pytest.raises(FolderError, match=r"echo/app\.py: no such file; .*echo\.resources_servers\.echo\.entrypoint"):
        create_app(folder)


def test_entrypoint_that_fails_to_import_names_the_module(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, app="import no_such_dependency\n" + SERVER)
    (folder / "requirements.txt").write_text("no_such_dependency\n")
    with pytest.raises(
        FolderError, match=r"app\.py: importing it failed: No module named 'no_such_dependency'; install"
    ):
        create_app(folder)


def test_no_server_class(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, app="x = 1\n")
    with pytest.raises(ServerClassError, match=r"app\.py: no resources-server class; expected a concrete"):
        create_app(folder)


def test_two_server_classes_and_no_main_block(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, app=SERVER + "\n\nclass OtherServer(EchoServer):\n    pass\n")
    with pytest.raises(ServerClassError, match=r"several resources-server classes \(EchoServer, OtherServer\)"):
        create_app(folder)


def test_main_block_picks_among_several(tmp_path: Path) -> None:
    main_block = "\n\nif __name__ == '__main__':\n    OtherServer.run_webserver()\n"
    app = SERVER + "\n\nclass OtherServer(EchoServer):\n    pass\n" + main_block
    assert type(create_app(make_folder(tmp_path, app=app)).state.gymhost.server).__name__ == "OtherServer"


def test_main_block_naming_something_else(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, app=SERVER + "\n\nif __name__ == '__main__':\n    EchoConfig.run_webserver()\n")
    with pytest.raises(ServerClassError, match=r"runs EchoConfig\.run_webserver\(\), but that is not a Simple"):
        create_app(folder)


def test_unresolvable_interpolation_and_the_override_that_fixes_it(tmp_path: Path) -> None:
    config = CONFIG.format(key="echo", name="echo") + "      greeting: ${judge_greeting}\n"
    folder = make_folder(tmp_path, config=config)
    with pytest.raises(FolderError, match=r"echo\.resources_servers\.echo: cannot resolve an interpolation"):
        create_app(folder)
    assert create_app(folder, greeting="hi").state.gymhost.server.config.greeting == "hi"


def test_interpolations_that_resolve_are_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECHO_GREETING", "from the environment")
    config = (
        "shared:\n  word: bonjour\n"
        + CONFIG.format(key="echo", name="echo")
        + "      greeting: ${oc.env:ECHO_GREETING}\n"
    )
    assert (
        create_app(make_folder(tmp_path, config=config)).state.gymhost.server.config.greeting == "from the environment"
    )


def test_invalid_config_field(tmp_path: Path) -> None:
    config = CONFIG.format(key="echo", name="echo") + "      port: not-a-port\n"
    folder = make_folder(tmp_path, config=config)
    with pytest.raises(FolderError, match=r"not a valid EchoConfig: port: Input should be a valid integer"):
        create_app(folder)


def test_several_servers_in_one_file_need_a_config_key(tmp_path: Path) -> None:
    config = CONFIG.format(key="echo_a", name="a") + CONFIG.format(key="echo_b", name="b")
    folder = make_folder(tmp_path, config=config)
    with pytest.raises(
        FolderError, match=r"several resources-server blocks \(echo_a, echo_b\); choose one with config_key="
    ):
        create_app(folder)
    assert create_app(folder, config_key="echo_b").state.gymhost.name == "echo_b"


def test_the_folder_named_config_wins_over_others(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    (folder / "configs" / "aaa_variant.yaml").write_text(CONFIG.format(key="variant", name="echo"))
    assert create_app(folder).state.gymhost.name == "echo"
    assert create_app(folder, config_key="variant").state.gymhost.name == "variant"


def test_sibling_modules_and_relative_imports_work(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, name="siblings")
    (folder / "helpers.py").write_text("GREETING = 'from a sibling'\n")
    (folder / "relative.py").write_text("WORD = 'relative'\n")
    app = "from helpers import GREETING\nfrom .relative import WORD\n" + SERVER.replace('"hello"', "GREETING + WORD")
    (folder / "app.py").write_text(app)
    assert create_app(folder).state.gymhost.server.config.greeting == "from a siblingrelative"


def test_unknown_top_level_key_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match=r"expected a top-level key 'nope' with"):
        create_app(make_folder(tmp_path), config_key="nope")


def test_server_whose_constructor_fails(tmp_path: Path) -> None:
    broken = SERVER + textwrap.dedent(
        """

        class BrokenServer(EchoServer):
            def model_post_init(self, context: object) -> None:
                raise RuntimeError("dataset file missing")


        if __name__ == "__main__":
            BrokenServer.run_webserver()
        """
    )
    with pytest.raises(FolderError, match=r"building BrokenServer failed: RuntimeError\('dataset file missing'\)"):
        create_app(make_folder(tmp_path, app=broken))
