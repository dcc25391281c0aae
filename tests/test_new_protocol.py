"""A new protocol is its subpackage and one line in ``environments/_registry.py``.

``echo``, a protocol of one tool that says back what it is given after a greeting, is defined below as its
subpackage would define it, from the backend interface (``_backend``) alone: its own ``source`` field (the greeting,
read at write time and at serve time), its instances, its tasks. It is registered with the one line a subpackage
adds (``BACKENDS``), then written, served and played as any other kind: nothing else in gymhost knows it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from agentenv_protocol import ToolResult
from pydantic import Field

from gymhost import EpisodeClient
from gymhost.environments import Task, awrite_folder
from gymhost.environments import _registry as registry
from gymhost.environments._backend import Backend, Catalog, Instance, ServerFolder, Source, WriteOptions, forever
from gymhost.environments._catalog import checked
from gymhost.environments._grading import Asked, Observation
from gymhost.environments._settings import PoolSettings, SourceConfig
from gymhost.environments._tasks import Seed, write_task_folder

from .agentenv_helpers import rows, served

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio]

BASE = "http://gymhost.test"
TOOL = {"name": "echo", "description": "Says the text back.", "inputSchema": {"type": "object"}}


# -- what the protocol's subpackage would hold ------------------------------------------------------------------------


class EchoSource(SourceConfig):
    """The ``source`` block of an ``echo`` server: a field no other kind has."""

    greeting: str = Field(default="hello", description="what every echo starts with")


@dataclass
class FoundEcho(Source):
    greeting: str = "hello"


class EchoSession:
    def __init__(self, client: EchoClient) -> None:
        self.client = client

    async def open(self) -> EchoSession:
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        said = f"{self.client.greeting} {arguments.get('text', '')}"
        self.client.said.append(said)
        return ToolResult(content=[{"type": "text", "text": said}])

    async def list_tools(self) -> list[dict[str, Any]]:
        return [TOOL]

    async def close(self) -> None:
        pass


class EchoClient:
    def __init__(self, index: int, greeting: str) -> None:
        self.base_url = f"echo://{index}"
        self.greeting = greeting
        self.said: list[str] = []

    async def describe(self) -> Catalog:
        return Catalog("echo", (TOOL,))

    async def hidden_tools(self, catalog: Catalog) -> set[str]:
        return set()

    async def clear(self) -> None:
        self.said.clear()

    async def state(self) -> Any:
        return {"said": self.said}

    async def aclose(self) -> None:
        pass

    async def begin(self, seed: Seed) -> None:
        pass

    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> EchoSession:
        return EchoSession(self)

    async def observe(self, catalog: Catalog, asked: Asked, final_text: str) -> Observation:
        return Observation()  # its tasks' criteria read the final text only


class EchoLauncher:
    description = "echo instances"
    owns_instances = True
    confinement_level = "none"  # instances inside the server

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        return Instance(index=index, client=EchoClient(index, self.greeting))  # type: ignore[arg-type]

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        pass

    async def exited(self, instance: Instance) -> None:
        await forever()

    async def close(self) -> None:
        pass


class EchoBackend(Backend[EchoSource]):
    kind = "echo"
    protocol = "echo"
    source_config = EchoSource
    default_instances: ClassVar[Mapping[str, tuple[int, int]]] = {"": (1, 2)}

    def launcher(self, source: EchoSource, folder: ServerFolder) -> EchoLauncher:
        return EchoLauncher(source.greeting)

    async def inspect(self, given: str, options: WriteOptions) -> Source | None:
        if not given.startswith("echo:"):
            return None
        greeting = given.removeprefix("echo:")
        task = Task.model_validate(
            {
                "id": "say-hi",
                "prompt": {"user": "Echo hi, then answer what the echo said."},
                "grading": {"criteria": [{"kind": "response", "equals": f"{greeting} hi"}]},
            }
        )
        found = FoundEcho(self.kind, Catalog("echo", (TOOL,)), [], {"eval": [task]}, {}, greeting=greeting)
        return checked(found, self.check_task)

    def source_fields(self, source: Source, instances: tuple[int, int], mode: str) -> list[tuple[str, Any, str]]:
        assert isinstance(source, FoundEcho)
        greeting = json.dumps(source.greeting)
        return [("kind", self.kind, ""), ("greeting", greeting, ""), ("instances", instances[0], "")]

    def copy_into(self, source: Source, folder: Path) -> str:
        write_task_folder(folder / "tasks", source.tasks, source.task_files)
        return "tasks"

    def what_it_does(self) -> str:
        return "Each tool call answers the greeting and the text; `/verify` grades the final text."


# -- the one registry line, and the protocol played ---------------------------------------------------------------


@pytest.fixture
def echo_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # first: bundle and urls, the last folder and URL kinds, answer every source left to them
    monkeypatch.setattr(registry, "BACKENDS", (EchoBackend(), *registry.BACKENDS))


@pytest.mark.usefixtures("echo_registered")
async def test_a_third_protocol_is_its_backend_and_one_registry_line(tmp_path: Path) -> None:
    folder = (await awrite_folder("echo:bonjour", tmp_path)).path
    assert 'greeting: "bonjour"' in (folder / "configs" / f"{folder.name}.yaml").read_text()
    (row,) = rows(folder)
    async with served(folder) as transport, EpisodeClient(BASE, transport=transport) as episode:
        await episode.seed(row)
        said = await episode.call_tool("echo", {"text": "hi"})
        assert (said.status_code, said.text) == (200, "bonjour hi")
        answer = await episode.verify(row, "bonjour hi")
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False)


@pytest.mark.usefixtures("echo_registered")
def test_the_config_gym_is_handed_keeps_the_kinds_own_fields() -> None:
    """The server's config as Gym's global config holds it (dumped): the source block with its kind's fields."""
    from gymhost.environments import WrittenResourcesServerConfig

    block = {"kind": "echo", "greeting": "bonjour"}
    gym = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py", "name": "echo", "environment": "echo"}
    config = WrittenResourcesServerConfig.model_validate({**gym, "source": block})
    assert isinstance(config.source, EchoSource)
    assert block.items() <= config.model_dump(mode="json")["source"].items()


@pytest.mark.usefixtures("echo_registered")
async def test_a_source_field_of_another_kind_is_refused_by_name(tmp_path: Path) -> None:
    folder = (await awrite_folder("echo:bonjour", tmp_path)).path
    config = folder / "configs" / f"{folder.name}.yaml"
    config.write_text(config.read_text().replace('greeting: "bonjour"', 'greeting: "bonjour"\n        mode: process'))
    with pytest.raises(Exception, match=r"source\.mode: Extra inputs are not permitted"):
        async with served(folder):
            pass
