"""The settings of a written server, each default written once.

A written folder's config block (``configs/<name>.yaml``) is flat, as every Gym config is: ``source`` and the
limits sit side by side. The limits are declared here, in two groups that each have one reader: the pool's
(``PoolSettings``: instances coming and going) and the episodes' (``EpisodeSettings``: what one episode may take).
The server's config class is built from the same field declarations, ``gymhost write`` writes the defaults from
them, and everything below the server receives a frozen settings object instead of keeping defaults of its own.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EpisodeFields", "EpisodeSettings", "PoolFields", "PoolSettings", "SourceConfig", "written_settings"]

Mode = Literal["process", "in_process"]


class SourceConfig(BaseModel):
    """Where the environment instances come from."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["bundle", "urls"]
    path: str | None = Field(default=None, description="bundle: its folder, relative to the server folder")
    mode: Mode = Field(
        default="process", description="bundle: one loopback process per instance, or instances inside the server"
    )
    instances: int = Field(default=4, ge=1, description="bundle: how many instances (= concurrent episodes)")
    urls: list[str] = Field(default_factory=list, description="urls: one base URL per independent instance")


class PoolFields(BaseModel):
    # Below verifiers' default request timeout (60 s), so a seed that finds no instance fails while its client waits.
    lease_timeout_s: float = Field(
        default=30.0, gt=0, description="a seed waits this long for a free instance, then answers 503"
    )
    data_timeout_s: float = Field(
        default=30.0, gt=0, description="the data plane's, the card's and grading extensions' limit"
    )
    startup_timeout_s: float = Field(default=60.0, gt=0, description="an instance's limit to come up")


class EpisodeFields(BaseModel):
    role: str | None = Field(default=None, description="the AgentEnv-Role header of tool calls")
    tool_timeout_s: float = Field(
        default=60.0, gt=0, description="a tool call's limit; past it the episode is masked and the instance replaced"
    )
    idle_timeout_s: float = Field(
        default=300.0, gt=0, description="an episode with no call for this long ends, masked as session_expired"
    )
    remember_s: float = Field(
        default=600.0, gt=0, description="closed sessions and verdicts are kept this long for late or repeated calls"
    )


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls, config: Any) -> Self:
        """The settings of a server config that carries these fields (``AgentEnvResourcesServerConfig``)."""
        return cls.model_validate({name: getattr(config, name) for name in cls.model_fields})


class PoolSettings(PoolFields, _Settings):
    """What the pool of instances reads."""


class EpisodeSettings(EpisodeFields, _Settings):
    """What the episode state machine reads."""


def written_settings() -> list[tuple[str, Any, str]]:
    """``(name, default, description)`` of every limit, in the order ``gymhost write`` writes them."""
    fields = {**EpisodeFields.model_fields, **PoolFields.model_fields}
    order = ["role", "lease_timeout_s", "tool_timeout_s", "data_timeout_s", "startup_timeout_s", "idle_timeout_s"]
    order += [name for name in fields if name not in order]
    return [(name, fields[name].default, fields[name].description or "") for name in order]
