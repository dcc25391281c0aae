"""The settings of a written server, each default written once.

A written folder's config block (``configs/<name>.yaml``) is flat, as every Gym config is: ``source`` and the
limits sit side by side. The limits are declared here, in two groups that each have one reader: the pool's
(``PoolSettings``: instances coming and going) and the episodes' (``EpisodeSettings``: what one episode may take).
The server's config class is built from the same field declarations, ``gymhost write`` writes the defaults from
them, and everything below the server receives a frozen settings object instead of keeping defaults of its own.
"""

from __future__ import annotations

from typing import Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "DEFAULT_INSTANCES",
    "EpisodeFields",
    "EpisodeSettings",
    "PoolFields",
    "PoolSettings",
    "SourceConfig",
    "instance_range",
    "written_settings",
]

Mode = Literal["process", "in_process"]

# What `gymhost write` gives a bundle when --instances is not said: (minimum, maximum) by mode. A training run keeps
# hundreds of episodes open, each holding its instance while the model thinks, so the pool grows on demand:
# - process: instances are forked from a template that imported the environment once; one of the gridsim example
#   has about 15 MB of its own (proportional set size 16 MB), so 256 of them take about 4 GiB of the 24 GiB machines
#   this is tested on, leaving room for environments heavier than gridsim; past that, seeds wait for releases;
# - in_process: an idle in-process instance is about 150 KB, so the bound is CPU, not memory: 512.
# An OpenEnv server's instances are its sessions, which the server bounds (``max_concurrent_envs``, 1 unless its
# author raised it): one, and seeds beyond it wait for it; say the server's number with --instances. agent-env's app
# for a bundle is started by the written server itself, with ``max_concurrent_envs`` its maximum: agent-env's own
# default, 8 (every episode runs an agent proxy with a server of its own in that process).
DEFAULT_INSTANCES: Final[dict[str, tuple[int, int]]] = {
    "process": (4, 256),
    "in_process": (4, 512),
    "openenv": (1, 1),
    "agent_env": (1, 8),
}


def instance_range(value: int | str | None, mode: str) -> tuple[int, int]:
    """``--instances`` as (minimum, maximum): ``K`` is a fixed pool of K, ``MIN:MAX`` grows and shrinks between
    the two, nothing is the default of ``mode`` (a bundle's mode, or ``openenv``)."""
    if value is None:
        return DEFAULT_INSTANCES[mode.replace("-", "_")]
    if isinstance(value, int):
        low, high = value, value
    else:
        text = value.strip()
        low_text, colon, high_text = text.partition(":")
        try:
            low, high = int(low_text), int(high_text if colon else low_text)
        except ValueError:
            raise ValueError(f"instances {value!r}: expected a number K or MIN:MAX, like 4 or 4:128") from None
    if low < 1 or high < low:
        raise ValueError(f"instances {value!r}: expected 1 <= MIN <= MAX")
    return low, high


class SourceConfig(BaseModel):
    """Where the environment instances come from."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["bundle", "urls", "openenv", "agent_env"]
    path: str | None = Field(
        default=None, description="bundle, agent_env: the bundle's folder, relative to the server folder"
    )
    mode: Mode = Field(
        default="process", description="bundle: one process per instance, or instances inside the server"
    )
    instances: int = Field(
        default=DEFAULT_INSTANCES["process"][0],
        ge=1,
        description="bundle, openenv, agent_env: instances always up (the pool's minimum)",
    )
    max_instances: int | None = Field(
        default=None,
        ge=1,
        description="bundle, openenv, agent_env: the most instances (= concurrent episodes); unset: a fixed pool",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="urls: one base URL per independent instance; openenv: the one URL of the OpenEnv server",
    )
    python: str | None = Field(
        default=None,
        description="agent_env: the Python of a venv with agentenv-framework[openenv], which runs agent-env's OpenEnv "
        "app for the bundle",
    )
    reply_tool: str | None = Field(
        default=None,
        description="openenv, agent_env: the tool that ends the model's turn with its reply (agent-env's end_turn), "
        "which a verify calls with the final assistant text while the turn is open; unset: none",
    )

    @model_validator(mode="after")
    def _maximum_above_minimum(self) -> Self:
        if self.max_instances is not None and self.max_instances < self.instances:
            raise ValueError(f"max_instances ({self.max_instances}) is below instances ({self.instances})")
        return self

    def bounds(self) -> tuple[int, int]:
        """(minimum, maximum) instances: a URL source has exactly its URLs."""
        if self.kind == "urls":
            return len(self.urls), len(self.urls)
        return self.instances, self.max_instances or self.instances


class PoolFields(BaseModel):
    # Below verifiers' default request timeout (60 s), so a seed that finds no instance fails while its client waits.
    lease_timeout_s: float = Field(
        default=30.0, gt=0, description="a seed waits this long for a free instance, then answers 503"
    )
    data_timeout_s: float = Field(
        default=30.0, gt=0, description="the data plane's, the card's and grading extensions' limit"
    )
    startup_timeout_s: float = Field(default=60.0, gt=0, description="an instance's limit to come up")
    # An RL run seeds in waves (a batch of rollouts, then a training step): long enough to keep instances across
    # the gap between waves, short enough to give memory back when a run pauses.
    instance_idle_s: float = Field(
        default=300.0, gt=0, description="an instance free for this long is stopped, down to the minimum"
    )
    # Starting an instance process is mostly imports, a few hundred ms of CPU: a few at a time use the cores
    # without starving the requests the server is serving meanwhile.
    parallel_startups: int = Field(default=4, ge=1, description="instances started at once when the pool grows")


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
    order += ["remember_s", "instance_idle_s", "parallel_startups"]
    order += [name for name in fields if name not in order]
    return [(name, fields[name].default, fields[name].description or "") for name in order]
