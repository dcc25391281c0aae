"""How a hosted resources server reaches the other Gym servers it calls (a judge, a policy model).

Under ``gym env start`` every server finds the others through the launcher's global config, fetched from the
head server, and Gym's client retries a refused connection forever. A standalone server has neither a head
server nor a launcher, so the host says where each named server lives (``server_urls``), and:

- a call to a name nobody mapped raises ``UnmappedServerError`` at once, naming the missing mapping;
- a mapped server that refuses connections is retried a few times, then ``UpstreamUnavailableError``;
- Gym's process-wide config is seeded, so no code path falls through to Hydra parsing ``sys.argv``.

Imported only after ``require_nemo_gym()``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import ClientConnectionError, ClientResponse
from nemo_gym import global_config as gym_global_config
from nemo_gym import server_utils
from nemo_gym.config_types import BaseServerConfig
from omegaconf import DictConfig, OmegaConf, open_dict
from pydantic import BaseModel, ConfigDict

from .._exceptions import UnmappedServerError, UpstreamUnavailableError
from ._folder import ServerSpec, referenced_servers
from ._lifespan import wrap_lifespan

__all__ = [
    "MappedServerClient",
    "build_server_client",
    "own_aiohttp_client",
    "seed_global_config",
]

_CONNECT_ATTEMPTS = 3
_RETRY_DELAY_S = 0.25
_DEFAULT_SERVER_TYPE = "responses_api_models"
# Gym's config refers to another server as {type: <server type>, name: <top-level key>}.
# Where a Gym config would put its head server; nothing is ever sent there, but ServerClient requires one.
_HEAD_SERVER = {"host": "127.0.0.1", "port": server_utils.DEFAULT_HEAD_SERVER_PORT}


class MappedServerClient(server_utils.ServerClient):  # type: ignore[misc]
    """Gym's ``ServerClient`` with an explicit name-to-URL map in place of the head server's config."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    server_urls: dict[str, str]

    def base_url(self, server_name: str) -> str:
        try:
            return self.server_urls[server_name].rstrip("/")
        except KeyError:
            mapped = ", ".join(sorted(self.server_urls)) or "none"
            raise UnmappedServerError(
                f"this server called the Gym server {server_name!r}, which is not mapped to a URL "
                f"(mapped: {mapped}); pass server_urls={{{server_name!r}: URL}} to create_app "
                f"or --server-url {server_name}=URL to gymhost serve"
            ) from None

    async def request(self, server_name: str, url_path: str, method: str, **kwargs: Any) -> ClientResponse:
        url = f"{self.base_url(server_name)}{url_path}"
        if "json" in kwargs:
            body = kwargs.pop("json")
            if isinstance(body, BaseModel):
                body = body.model_dump(exclude_unset=True)
            kwargs["data"] = orjson.dumps(body)
            kwargs["headers"] = {**(kwargs.get("headers") or {}), "Content-Type": "application/json"}
        client = server_utils.get_global_aiohttp_client()
        for attempt in range(1, _CONNECT_ATTEMPTS + 1):
            try:
                response: ClientResponse = await client.request(method=method, url=url, **kwargs)
                return response
            except ClientConnectionError as error:
                if attempt == _CONNECT_ATTEMPTS:
                    raise UpstreamUnavailableError(
                        f"the Gym server {server_name!r} at {url} did not answer after {attempt} tries: {error}"
                    ) from error
                await asyncio.sleep(_RETRY_DELAY_S * attempt)
        raise AssertionError("unreachable")


def build_server_client(spec: ServerSpec, config: Any, server_urls: Mapping[str, str]) -> MappedServerClient:
    """The server's client, and its view of the config: its folder's whole config (the other servers its configs
    define included, as Gym's launcher hands every server the whole config), with its own block as validated and
    the mapped servers' addresses; some servers read a peer's settings there (xstest, its judge's)."""
    whole: dict[str, Any] = dict(spec.config or {})
    whole[config.name] = {"resources_servers": {spec.implementation: config.model_dump(mode="json")}}
    for name, entry in _peer_entries(spec, server_urls, whole).items():
        whole[name] = entry
    return MappedServerClient(
        head_server_config=BaseServerConfig(**_HEAD_SERVER),
        global_config_dict=OmegaConf.create(whole),
        server_urls=dict(server_urls),
    )


def _peer_entries(spec: ServerSpec, server_urls: Mapping[str, str], known: Mapping[str, Any]) -> dict[str, Any]:
    """Each mapped server's config entry with its address: in the block the configs give it, else a block of its
    own (``{type: {name: {host, port}}}``)."""
    types = referenced_servers(spec.block)
    entries: dict[str, Any] = {}
    for name, url in server_urls.items():
        parts = urlsplit(url)
        address = {"host": parts.hostname, "port": parts.port or (443 if parts.scheme == "https" else 80)}
        server_type = types.get(name, _DEFAULT_SERVER_TYPE)
        given = known.get(name)
        implementations = given.get(server_type) if isinstance(given, Mapping) else None
        if isinstance(implementations, Mapping) and implementations:
            entries[name] = {server_type: {impl: {**block, **address} for impl, block in implementations.items()}}
        else:
            entries[name] = {server_type: {name: address}}
    return entries


def seed_global_config(spec: ServerSpec, config: Any, server_urls: Mapping[str, str]) -> DictConfig:
    """Put this server and its mapped peers into Gym's process-wide config, and return that config.

    Some servers read it directly (``get_global_config_dict()``, ``get_first_server_config_dict``), and Gym's
    aiohttp client reads it on first use; left empty, that first use parses ``sys.argv`` with Hydra.
    """
    entries: dict[str, Any] = {
        **(spec.env_values or {}),  # env.yaml's keys sit at the root of Gym's config, as its launcher puts them
        gym_global_config.HEAD_SERVER_KEY_NAME: dict(_HEAD_SERVER),
        config.name: {"resources_servers": {spec.implementation: config.model_dump(mode="json")}},
        **_peer_entries(spec, server_urls, {}),
    }

    ours = OmegaConf.create(entries)
    existing = gym_global_config._GLOBAL_CONFIG_DICT
    if existing is None and os.environ.get(gym_global_config.NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME):
        existing = gym_global_config.get_global_config_dict()
    if existing is None:
        gym_global_config._GLOBAL_CONFIG_DICT = ours
        return ours
    with open_dict(existing):
        existing.merge_with(ours)
    assert isinstance(existing, DictConfig)
    return existing


def own_aiohttp_client(app: Any, global_config: DictConfig) -> None:
    """Make the app's lifespan open Gym's process-wide aiohttp client, and close it on shutdown.

    aiohttp sessions belong to the event loop that made them. Opening it lazily on the first outbound call
    (Gym's way) ties it to whichever loop served that call; opening it in the lifespan ties it to the server's
    loop, and closing it there means the next lifespan (a test, a reload) starts clean. An app whose lifespan
    finds a client already open leaves it to its owner.
    """

    @asynccontextmanager
    async def aiohttp_client(app_: Any) -> AsyncIterator[None]:
        owned = not server_utils.is_global_aiohttp_client_setup()
        if owned:
            cfg = server_utils.GlobalAIOHTTPAsyncClientConfig.model_validate(
                OmegaConf.to_container(global_config, resolve=False)
            )
            server_utils.set_global_aiohttp_client(cfg)
        try:
            yield
        finally:
            client = server_utils._GLOBAL_AIOHTTP_CLIENT
            if owned and client is not None:
                server_utils._GLOBAL_AIOHTTP_CLIENT = None
                await client.close()

    wrap_lifespan(app, aiohttp_client)
