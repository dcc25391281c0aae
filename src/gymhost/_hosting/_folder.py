"""Find the resources server a folder describes, the way ``gym env start`` would.

A Gym config never names the server class; it names a top-level instance key whose
``resources_servers.<implementation>`` block carries an ``entrypoint``. That key becomes the server's runtime
``name`` (so ``example_session_state_mgmt``'s cookie is named after ``example_session_state_mgmt_resources_server``,
not the folder). This module reproduces that lookup and nothing else: no import of the server, no network.

The values a Gym deployment keeps out of its configs (``policy_base_url``, judge URLs and keys) live in ``env.yaml``,
whose top-level keys Gym's launcher merges into the root of the config, above the config files and below the
command line; the configs' interpolations (``${policy_base_url}``) resolve against that root. The same file is read
here, found where Gym looks for it (``NEMO_GYM_EXTRA_ROOTS``, then the working directory, then nemo-gym's install
root), and also in the Gym root the folder sits in, where ``gym env start`` is run from.

It also finds the dataset files a folder's configs declare (``declared_datasets``), which a confined server keeps
out of sight.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import FolderError

__all__ = [
    "ENV_YAML",
    "ServerSpec",
    "declared_datasets",
    "existing_folder",
    "find_env_yaml",
    "load_server_spec",
    "referenced_servers",
]

_RESOURCES_SERVERS = "resources_servers"
ENV_YAML = "env.yaml"
# Gym's config refers to another server as {type: <server type>, name: <top-level key>}.
_SERVER_TYPES = {"responses_api_models", "resources_servers", "responses_api_agents", "environment_servers"}
_EXTRA_ROOTS_ENV_VAR = "NEMO_GYM_EXTRA_ROOTS"  # nemo-gym's own variable: os.pathsep-separated search roots


@dataclass(frozen=True)
class ServerSpec:
    """A resources server as its folder describes it, with interpolations resolved."""

    folder: Path
    config_file: Path
    config_key: str
    implementation: str
    block: dict[str, Any]
    env_yaml: Path | None = None  # the env.yaml merged into the config, if one was found
    env_values: dict[str, Any] | None = None  # its top-level keys, for Gym's process-wide config
    config: dict[str, Any] | None = None  # the whole config the block is in, env.yaml's keys merged, unresolved

    @property
    def entrypoint(self) -> Path:
        return self.folder / str(self.block["entrypoint"])

    @property
    def written(self) -> bool:
        """Whether ``gymhost write`` made the block (its hosted code is its instances): it has a ``source.kind``."""
        source = self.block.get("source")
        return isinstance(source, dict) and "kind" in source

    def where(self) -> str:
        """Where the block lives, for error messages: ``file: key.resources_servers.impl``."""
        return f"{self.config_file}: {self.config_key}.{_RESOURCES_SERVERS}.{self.implementation}"


def load_server_spec(
    folder: str | Path,
    *,
    config_key: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ServerSpec:
    """Locate the resources-server block of ``folder`` and resolve it.

    ``env.yaml`` (``find_env_yaml``) is merged into the config's root, as Gym's launcher merges it, and ``overrides``
    into the block, above both, before interpolations are resolved: a value a deployment keeps in ``env.yaml``
    (``${judge_api_key}``) can also be given here.
    """
    root = existing_folder(folder)
    configs = _config_files(root)
    env_yaml = find_env_yaml(root)
    env_values = _env_values(env_yaml) if env_yaml is not None else None
    missing_entrypoint: list[str] = []
    for config_file in configs:
        config = _load_yaml(config_file)
        candidates = _resources_server_blocks(config_file, config, missing_entrypoint)
        if config_key is not None:
            candidates = [c for c in candidates if c[0] == config_key]
        if not candidates:
            continue
        key, implementation = _choose(config_file, root, candidates)
        if env_values:
            config = _merged(config, env_values)
        block = _resolve_block(config_file, config, key, implementation, overrides or {}, env_yaml)
        whole = _container(config)
        spec = ServerSpec(root, config_file, key, implementation, block, env_yaml, env_values, whole)
        if not spec.entrypoint.is_file():
            raise FolderError(
                f"{spec.entrypoint}: no such file; {spec.where()}.entrypoint names it as the server's entrypoint"
            )
        return spec

    looked_in = ", ".join(p.name for p in configs)
    if missing_entrypoint:
        raise FolderError(
            f"{missing_entrypoint[0]} has no entrypoint; expected e.g. 'entrypoint: app.py' in that block"
        )
    wanted = f"a top-level key {config_key!r} with" if config_key else "a top-level key with"
    raise FolderError(
        f"{root / 'configs'}: no resources-server block; expected {wanted} "
        f"'{_RESOURCES_SERVERS}: {{<implementation>: {{entrypoint: app.py}}}}' (looked in {looked_in})"
    )


def find_env_yaml(folder: Path) -> Path | None:
    """The ``env.yaml`` Gym's launcher would read for ``folder``: in each ``NEMO_GYM_EXTRA_ROOTS`` root, the working
    directory, the Gym root that holds the folder (``ROOT/resources_servers/<name>``), then nemo-gym's install root;
    the first that exists."""
    roots = [Path(entry) for entry in os.environ.get(_EXTRA_ROOTS_ENV_VAR, "").split(os.pathsep) if entry]
    roots.append(Path.cwd())
    if folder.parent.name == _RESOURCES_SERVERS:
        roots.append(folder.parent.parent)
    install_root = _nemo_gym_install_root()
    if install_root is not None:
        roots.append(install_root)
    for root in roots:
        candidate = root / ENV_YAML
        if candidate.is_file():
            return candidate.resolve()
    return None


def _nemo_gym_install_root() -> Path | None:
    """nemo-gym's ``PARENT_DIR`` (the checkout, or ``site-packages``), found without importing it."""
    spec = importlib.util.find_spec("nemo_gym")
    return Path(spec.origin).parent.parent if spec is not None and spec.origin else None


def _env_values(path: Path) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    config = _load_yaml(path)
    if not isinstance(config, DictConfig):
        raise FolderError(f"{path}: not a mapping of top-level keys, as Gym's env.yaml is")
    values = OmegaConf.to_container(config, resolve=False)
    assert isinstance(values, dict)
    return {str(key): value for key, value in values.items()}


def _container(config: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    whole = OmegaConf.to_container(config, resolve=False)
    assert isinstance(whole, dict)
    return {str(key): value for key, value in whole.items()}


def _merged(config: Any, env_values: Mapping[str, Any]) -> Any:
    """The config with env.yaml's keys at its root, where Gym's launcher puts them (above the config files)."""
    from omegaconf import OmegaConf

    return OmegaConf.merge(config, dict(env_values))


def existing_folder(folder: str | Path) -> Path:
    path = Path(folder).expanduser()
    if not path.exists():
        raise FolderError(f"{path}: no such folder; expected a resources-server folder with app.py and configs/")
    if not path.is_dir():
        raise FolderError(f"{path}: not a folder; expected a resources-server folder with app.py and configs/")
    return path.resolve()


def declared_datasets(folder: Path) -> list[Path]:
    """The dataset files the folder's configs declare (each ``jsonl_fpath``, under an agent's ``datasets``, relative
    to the Gym root the folder sits in or to the working directory, as Gym's launcher reads them) that are on this
    machine, with the ``<stem>_prepare*.jsonl`` copies ``ng_prepare_data`` writes beside them. They are the trainer's
    rows: a server is sent each row in a request and never reads them."""
    from omegaconf import OmegaConf

    def paths(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "jsonl_fpath" and isinstance(value, str):
                    yield value
                else:
                    yield from paths(value)
        elif isinstance(node, list):
            for value in node:
                yield from paths(value)

    found: dict[Path, None] = {}
    for config_file in _config_files(folder):
        try:
            config = OmegaConf.to_container(_load_yaml(config_file), resolve=False)
        except (FolderError, ValueError):
            continue  # not this module's to judge: serving reads only the server's own config
        for declared in paths(config):
            for root in (folder.parent.parent, Path.cwd()):
                path = root / declared  # an absolute path stays itself
                if path.is_file():
                    found[path.resolve()] = None
                    found.update(
                        dict.fromkeys(p.resolve() for p in path.parent.glob(f"{glob.escape(path.stem)}_prepare*.jsonl"))
                    )
    return list(found)


def _config_files(root: Path) -> list[Path]:
    """``configs/<folder name>.yaml`` first, then the other YAML files in name order."""
    configs_dir = root / "configs"
    files = sorted(p for p in configs_dir.glob("*.y*ml") if p.suffix in {".yaml", ".yml"} and p.is_file())
    if not files:
        raise FolderError(
            f"{configs_dir}: no configs/*.yaml; expected configs/{root.name}.yaml holding the server's "
            f"'{_RESOURCES_SERVERS}' block"
        )
    preferred = [p for p in files if p.stem == root.name]
    return preferred + [p for p in files if p.stem != root.name]


def _load_yaml(config_file: Path) -> Any:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(config_file)
    except Exception as error:  # omegaconf and yaml raise a dozen unrelated classes
        raise FolderError(f"{config_file}: not a readable YAML config: {error}") from error


def _resources_server_blocks(config_file: Path, config: Any, missing_entrypoint: list[str]) -> list[tuple[str, str]]:
    """(top-level key, implementation) pairs whose block has an entrypoint, in file order."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(config, DictConfig):
        return []
    raw = OmegaConf.to_container(config, resolve=False)
    assert isinstance(raw, dict)
    found: list[tuple[str, str]] = []
    for key, value in raw.items():
        servers = value.get(_RESOURCES_SERVERS) if isinstance(value, dict) else None
        if not isinstance(servers, dict):
            continue
        for implementation, block in servers.items():
            where = (str(key), str(implementation))
            if isinstance(block, dict) and block.get("entrypoint"):
                found.append(where)
            elif isinstance(block, dict):
                missing_entrypoint.append(f"{config_file}: {where[0]}.{_RESOURCES_SERVERS}.{where[1]}")
    return found


def _choose(config_file: Path, root: Path, candidates: list[tuple[str, str]]) -> tuple[str, str]:
    if len(candidates) == 1:
        return candidates[0]
    named_after_folder = [c for c in candidates if c[1] == root.name]
    if len(named_after_folder) == 1:
        return named_after_folder[0]
    keys = ", ".join(key for key, _ in candidates)
    raise FolderError(f"{config_file}: several resources-server blocks ({keys}); choose one with config_key=")


def _resolve_block(
    config_file: Path,
    config: Any,
    key: str,
    implementation: str,
    overrides: Mapping[str, Any],
    env_yaml: Path | None,
) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    where = f"{config_file}: {key}.{_RESOURCES_SERVERS}.{implementation}"
    try:
        block = config[key][_RESOURCES_SERVERS][implementation]
        if overrides:
            # Merging into the node itself keeps its parent, so ${..x} and ${other_key.x} still resolve.
            merged = OmegaConf.merge(block, dict(overrides))
            config[key][_RESOURCES_SERVERS][implementation] = merged
            block = config[key][_RESOURCES_SERVERS][implementation]
        resolved = OmegaConf.to_container(block, resolve=True)
    except OmegaConfBaseException as error:
        detail = str(error).splitlines()[0]
        read = f"read {env_yaml}" if env_yaml is not None else "found no env.yaml"
        raise FolderError(
            f"{where}: cannot resolve an interpolation ({detail}); set the value in env.yaml, as for Gym's launcher "
            f"({read}), in the config, or pass it as an override"
        ) from error
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}


def referenced_servers(block: Mapping[str, Any]) -> dict[str, str]:
    """``{name: type}`` of every ``{type, name}`` server reference in a config block, at any depth."""
    return dict(_walk_refs(block))


def _walk_refs(value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        if value.get("type") in _SERVER_TYPES and isinstance(value.get("name"), str):
            yield value["name"], value["type"]
        for child in value.values():
            yield from _walk_refs(child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk_refs(child)
