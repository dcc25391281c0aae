"""``gymhost write``: an agent environment in, an ordinary Gym resources-server folder out.

The folder (``ROOT/resources_servers/<name>/``) is self-contained and relocatable: ``app.py``, ``configs/<name>.yaml``
(the resources server and a simple agent, which ``gym env start`` runs on nemo-gym 0.4.0 and 0.7.0),
``configs/<name>_environment_server.yaml`` (the environment server nemo-gym 0.7.0 routes rollouts through; 0.4.0's
launcher refuses the block, so it is a file of its own), ``data/<split>.jsonl`` (one Gym row per task),
``requirements.txt`` (gymhost named the way it was installed here, so Gym's launcher can build the server's venv),
a README, and the bundle itself copied in (or, for a URL source, the tasks). It is built in a scratch folder beside
the target and moved into place at the end, so a failed write leaves nothing half-written. Writing needs neither
nemo-gym nor omegaconf: the YAML is written from a template.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..._hosting._venvs import gymhost_dependency, gymhost_requirement
from .._backend import Backend, Source, WriteOptions
from .._catalog import responses_tool, task_tools
from .._errors import WriteError
from .._registry import backend_of, inspect_source
from .._settings import DEFAULT_MODE, parse_instances, written_settings
from .._tasks import Task

__all__ = ["WrittenFolder", "awrite_folder", "write_folder"]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class WrittenFolder:
    """Where the folder went and what is in it, for the command line to report."""

    def __init__(self, path: Path, name: str, source: Source, rows: dict[str, int]) -> None:
        self.path, self.name, self.source, self.rows = path, name, source, rows


def write_folder(
    source: str,
    root: str | Path,
    *,
    name: str | None = None,
    split: str | None = None,
    tasks_file: str | Path | None = None,
    urls: Sequence[str] = (),
    instances: int | str | None = None,
    mode: str = DEFAULT_MODE,
    prompt_field: str | None = None,
    python: str | None = None,
    force: bool = False,
) -> WrittenFolder:
    """Write ``root/resources_servers/<name>/`` for the environment at ``source``: a bundle folder (gymhost's, or
    agent-env's, whose app ``python`` runs), the URL of an OpenEnv server, or the URL of an agentenv environment
    (with ``tasks_file``).

    ``instances`` (a bundle's or an OpenEnv server's): ``K`` for a fixed pool of K, ``"MIN:MAX"`` for a pool that
    grows on demand and shrinks when idle, None for the source kind's default (``Backend.default_instances``).
    ``prompt_field``: where an OpenEnv server's tasks keep their prompts (``_openenv._tasks``).

    Synchronous; from async code, ``await awrite_folder(...)`` with the same arguments.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise WriteError("write_folder() was called inside a running event loop; use `await awrite_folder(...)`")
    return asyncio.run(
        awrite_folder(
            source,
            root,
            name=name,
            split=split,
            tasks_file=tasks_file,
            urls=urls,
            instances=instances,
            mode=mode,
            prompt_field=prompt_field,
            python=python,
            force=force,
        )
    )


async def awrite_folder(
    source: str,
    root: str | Path,
    *,
    name: str | None = None,
    split: str | None = None,
    tasks_file: str | Path | None = None,
    urls: Sequence[str] = (),
    instances: int | str | None = None,
    mode: str = DEFAULT_MODE,
    prompt_field: str | None = None,
    python: str | None = None,
    force: bool = False,
) -> WrittenFolder:
    """``write_folder`` for async code: the environment is started and asked for its card on the caller's loop."""
    mode = mode.replace("-", "_")
    if mode not in ("process", "in_process"):
        raise WriteError(f"mode {mode!r}: expected process or in-process")
    try:
        given = parse_instances(instances)
    except ValueError as error:
        raise WriteError(str(error)) from None
    if name is not None and not _NAME.match(name):
        raise WriteError(f"--name {name!r}: expected lower-case letters, digits and _, starting with a letter")
    options = WriteOptions(
        extra_urls=urls,
        tasks_file=Path(tasks_file) if tasks_file else None,
        split=split,
        prompt_field=prompt_field,
        python=python,
    )
    inspected = await inspect_source(source, options)
    backend = backend_of(inspected.kind)
    bounds = given or backend.instances(mode)
    name = name or _default_name(inspected)
    target = Path(root).resolve() / "resources_servers" / name
    if target.exists() and not force:
        raise WriteError(f"{target}: already exists; pass --force to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)

    scratch = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
    try:
        rows = _write_contents(scratch, name, inspected, backend, bounds, mode)
        if target.exists():
            old = target.with_name(f".{name}.replaced")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            scratch.rename(target)
            shutil.rmtree(old)
        else:
            scratch.rename(target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return WrittenFolder(target, name, inspected, rows)


def _default_name(source: Source) -> str:
    base = source.bundle.name if source.bundle is not None else source.environment
    name = re.sub(r"[^a-z0-9_]+", "_", base.lower()).strip("_")
    if not name or not name[0].isalpha():
        name = f"env_{name}".strip("_")
    if not _NAME.match(name):
        raise WriteError(f"cannot make a folder name from {base!r}; pass --name")
    return name


def _write_contents(
    folder: Path, name: str, source: Source, backend: Backend[Any], instances: tuple[int, int], mode: str
) -> dict[str, int]:
    (folder / "configs").mkdir()
    (folder / "data").mkdir()
    tasks_path = backend.copy_into(source, folder)

    agent = f"{name}_simple_agent"
    rows: dict[str, int] = {}
    for split, tasks in source.tasks.items():
        lines = [json.dumps(_row(task, split, source.tools, agent)) for task in tasks]
        (folder / "data" / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        rows[split] = len(lines)

    (folder / "app.py").write_text(_app_py(name, source), encoding="utf-8")
    source_block = _source_yaml(backend.source_fields(source, instances, mode))
    config = _config_yaml(name, source, backend, source_block, tasks_path, rows)
    (folder / "configs" / f"{name}.yaml").write_text(config)
    (folder / "configs" / f"{name}_environment_server.yaml").write_text(_environment_server_yaml(name))
    (folder / "requirements.txt").write_text(_requirements(source, backend))
    (folder / "README.md").write_text(_readme(name, source, backend, rows))
    return rows


def _row(task: Task, split: str, tools: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": task.prompt.system}] if task.prompt.system else []
    messages.append({"role": "user", "content": task.prompt.user})
    return {
        "responses_create_params": {"input": messages, "tools": [responses_tool(t) for t in task_tools(task, tools)]},
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "task_id": task.id,
        "split": split,
    }


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part) + "ResourcesServer"


def _app_py(name: str, source: Source) -> str:
    cls = _class_name(name)
    return f'''"""NeMo Gym resources server for the agent environment {source.environment!r}.

Written by `gymhost write`. Serve it with `gymhost serve .` from this folder,
or let Gym's launcher (`gym env start`) run this file.
"""

from pathlib import Path

from gymhost.environments import WrittenResourcesServer


class {cls}(WrittenResourcesServer):
    folder = Path(__file__).resolve().parent


if __name__ == "__main__":
    {cls}.run_webserver()
'''


def _source_yaml(fields: list[tuple[str, Any, str]]) -> str:
    """The ``source`` block's lines: ``field: value  # comment``, a list as one ``- item`` line each."""
    lines = []
    for name, value, comment in fields:
        if isinstance(value, list):
            lines += [f"        {name}:", *(f"        - {item}" for item in value)]
        else:
            lines.append(f"        {name}: {value}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)


def _config_yaml(
    name: str, source: Source, backend: Backend[Any], source_block: str, tasks_path: str, rows: dict[str, int]
) -> str:
    q = json.dumps  # a JSON string is a valid YAML scalar
    datasets = "\n".join(
        f"""      - name: {q(split)}
        type: {q(_dataset_type(split))}
        license: "TBD"  # the tasks' license; Gym requires one for train and validation datasets
        jsonl_fpath: {q(f"resources_servers/{name}/data/{split}.jsonl")}"""
        for split in rows
    )
    return f"""# Written by `gymhost write` for the agent environment {q(source.environment)}.
# Serve the resources server with `gymhost serve` on this folder. Gym's launcher runs both blocks (tested on nemo-gym
# 0.4.0 and 0.7.0, with the launcher reusing an existing venv: see README.md); on 0.7.0 give it
# configs/{name}_environment_server.yaml too.
{name}_resources_server:
  resources_servers:
    {name}:
      entrypoint: app.py
      domain: agent
      verified: false
      description: {q(f"{backend.protocol} environment {source.environment} as a Gym resources server (gymhost)")}
      environment: {q(source.environment)}
      source:
{source_block}
      tasks: {q(tasks_path)}
{_settings_yaml()}
{name}_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: {name}_resources_server
      model_server:
        type: responses_api_models
        name: policy_model
      datasets:
{datasets}
"""


def _environment_server_yaml(name: str) -> str:
    return f"""# Written by `gymhost write`: the environment server nemo-gym 0.7.0 routes rollouts through, for
# the simple agent of {name}.yaml. Give it to Gym's launcher with that file on 0.7.0 (`--config` twice);
# nemo-gym 0.4.0 has no environment servers and refuses this block.
{name}_environment_server:
  environment_servers:
    legacy_agent:
      entrypoint: app.py
      agent_server:
        type: responses_api_agents
        name: {name}_simple_agent
"""


def _settings_yaml() -> str:
    """The limits with their defaults and what each means, as YAML lines of the server block."""
    lines = [(f"{name}: {_yaml_scalar(value)}", description) for name, value, description in written_settings()]
    width = max(len(line) for line, _ in lines)
    return "\n".join(f"      {line:<{width}}  # {description}" for line, description in lines)


def _yaml_scalar(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else json.dumps(value)  # JSON's null and strings are YAML too


def _dataset_type(split: str) -> str:
    return split if split in ("train", "validation", "example") else "validation"


def _requirements(source: Source, backend: Backend[Any]) -> str:
    lines = [gymhost_requirement(), gymhost_dependency("agentenv-framework-protocol"), *backend.requirements(source)]
    return "\n".join(dict.fromkeys(lines)) + "\n"


def _readme(name: str, source: Source, backend: Backend[Any], rows: dict[str, int]) -> str:
    origin = (
        f"the {backend.protocol} bundle in `bundle/` (copied from `{source.bundle}`)"
        if source.bundle
        else f"the {backend.protocol} server at " + ", ".join(f"`{url}`" for url in source.urls)
    )
    tools = ", ".join(f"`{tool['name']}`" for tool in source.tools)
    data = ", ".join(f"`data/{split}.jsonl` ({count} rows)" for split, count in rows.items())
    return f"""# {name}

A NeMo Gym resources server for the {backend.protocol} environment `{source.environment}`, written by
`gymhost write` from {origin}. Tools: {tools}. Rows: {data}.

## Serve it

```
gymhost serve resources_servers/{name} --port 8000      # or: cd resources_servers/{name} && gymhost serve .
GYMHOST_FOLDER=resources_servers/{name} uvicorn gymhost.asgi:app --port 8000
```

An episode the environment or the infrastructure lost gets a masked verdict (`mask_sample: true`), never a score.
Served by gymhost it is refused with an HTTP error by default, which verifiers fails the rollout on (it never reads
`mask_sample`); `--masked-verdicts answer` answers it as a 200 instead, for clients that read `mask_sample` (Gym
0.5+'s rollout collection). Under Gym's own launcher it is answered on nemo-gym 0.5+ and refused on 0.4.0.

## Under Gym's launcher

`configs/{name}.yaml` has the resources server and a simple agent; on nemo-gym 0.7.0,
`configs/{name}_environment_server.yaml` adds the environment server its rollouts go through. From the Gym root
(the folder that holds `resources_servers/`), with a model server of yours:

```
gym env start --config resources_servers/{name}/configs/{name}.yaml \\
  --config resources_servers/{name}/configs/{name}_environment_server.yaml \\
  --model-type vllm_model --model-url http://HOST:PORT/v1 --model MODEL --model-api-key KEY
```

(nemo-gym 0.4.0: only the first `--config`, and `++head_server.host=127.0.0.1 ++head_server.port=11000` if you set
either.) Gym builds a venv per server from its `requirements.txt` with uv; this one names gymhost the way it was
installed where the folder was written (edit that line if gymhost comes from elsewhere on the machine that runs it;
gymhost's tests do not run that build, which needs uv and a package index).
To reuse a venv that has nemo-gym and gymhost instead, link it as each server's venv and tell Gym not to build:

```
for server in resources_servers/{name} responses_api_agents/simple_agent \\
    responses_api_models/vllm_model environment_servers/legacy_agent; do
  mkdir -p venvs/$server && ln -sfn "$VIRTUAL_ENV" venvs/$server/.venv
done
gym env start ... ++uv_venv_dir=$PWD/venvs ++skip_venv_if_present=true
```

## What it does

{backend.what_it_does()} `GET /agentenv/pool` shows the instances.

Check that every reference solution scores 1.0 and an empty attempt does not:

```
gymhost check resources_servers/{name}
```
"""
