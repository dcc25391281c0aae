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
    "DEFAULT_CONSTRUCT_ONCE",
    "DEFAULT_MINIMUM",
    "DEFAULT_MODE",
    "EpisodeFields",
    "EpisodeSettings",
    "Mode",
    "PoolFields",
    "PoolSettings",
    "SourceConfig",
    "parse_instances",
    "written_settings",
]

Mode = Literal["process", "in_process"]
# A bundle's instances: processes of their own unless a config or `gymhost write --mode` says otherwise.
DEFAULT_MODE: Final[Mode] = "process"

# Process instances are forked from one environment the template constructed, where its constructor allows it
# (``_agentenv/_construct_once``): a start costs a fork, not a construction.
DEFAULT_CONSTRUCT_ONCE: Final = True

# Where a written folder's tasks are when its config does not say: a folder of <split>.jsonl files, relative to it.
DEFAULT_TASKS: Final = "tasks"

# Instances always up when a config does not say (a bundle's pool's minimum); each kind's defaults for
# `gymhost write` are its backend's (``Backend.default_instances``).
DEFAULT_MINIMUM: Final = 4


def parse_instances(value: int | str | None) -> tuple[int, int] | None:
    """``--instances`` as (minimum, maximum): ``K`` is a fixed pool of K, ``MIN:MAX`` grows and shrinks between
    the two; None when not given (the source's backend has the default)."""
    if value is None:
        return None
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
    """Where the environment instances come from: the fields every kind's ``source`` block has. Each backend declares
    its kind's own fields in a subclass (``Backend.source_config``), and the server's config reads the block with the
    class its ``kind`` names, so a new protocol's fields are its own."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="which backend reaches the instances (_registry; the server's config checks it)")
    instances: int = Field(default=DEFAULT_MINIMUM, ge=1, description="instances always up (the pool's minimum)")
    max_instances: int | None = Field(
        default=None, ge=1, description="the most instances (= concurrent episodes); unset: a fixed pool"
    )

    @model_validator(mode="after")
    def _maximum_above_minimum(self) -> Self:
        if self.max_instances is not None and self.max_instances < self.instances:
            raise ValueError(f"max_instances ({self.max_instances}) is below instances ({self.instances})")
        return self


class PoolFields(BaseModel):
    # Below verifiers' default request timeout (60 s), so a seed that finds no instance fails while its client waits.
    lease_timeout_s: float = Field(
        default=30.0, gt=0, description="a seed waits this long for a free instance, then answers 503"
    )
    data_timeout_s: float = Field(
        default=30.0, gt=0, description="the data plane's, the card's and grading extensions' limit"
    )
    # Past what a loaded host takes: agent-env's app imports its framework in tens of seconds on a quiet machine, and
    # took over 60 s on two cores shared with other work. A start this slow is hung, not busy.
    startup_timeout_s: float = Field(default=120.0, gt=0, description="an instance's limit to come up")
    # An RL run seeds in waves (a batch of rollouts, then a training step): long enough to keep instances across
    # the gap between waves, short enough to give memory back when a run pauses.
    instance_idle_s: float = Field(
        default=300.0, gt=0, description="an instance free for this long is stopped, down to the minimum"
    )
    # An instance start (a fork of the template, then the environment's construction) is all CPU: a few at a time
    # use the cores without starving the requests the server is serving meanwhile; more at once started no faster.
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
        """The settings of a server config that carries these fields (``WrittenResourcesServerConfig``)."""
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
