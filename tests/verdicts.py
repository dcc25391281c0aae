"""Reading a written server's verdict on either nemo-gym, and holding it to the rule for masked ones.

nemo-gym 0.5+ answers a masked verdict as a 200 with ``mask_sample: true``. nemo-gym 0.4.0's verify answer has no
``mask_sample``, and its clients train on the reward of every 200, so there a masked verdict is refused: 410, 502 or
503, with the verdict under ``verdict``. ``verdict`` returns the verdict either way and fails the test when a server
breaks the rule for its version.
"""

from __future__ import annotations

from typing import Any

import httpx

from gymhost import EpisodeClient

REFUSAL_STATUSES = (410, 502, 503)


def carries_mask() -> bool:
    from gymhost._nemo_gym import verdicts_carry_mask

    return verdicts_carry_mask()


def read_verdict(response: httpx.Response) -> dict[str, Any]:
    """The verdict a ``/verify`` response gives, checked against the rule above."""
    body: dict[str, Any] = response.json()
    if response.status_code == 200:
        assert not (body.get("mask_sample") and not carries_mask()), f"a masked verdict answered 200 on 0.4.0: {body}"
        return body
    assert not carries_mask(), f"/verify answered {response.status_code} where it can mask: {body}"
    assert response.status_code in REFUSAL_STATUSES, f"/verify answered {response.status_code}: {body}"
    verdict: dict[str, Any] = body["verdict"]
    assert verdict["mask_sample"] is True, body
    assert body["failure_kind"] == verdict["failure_kind"], body
    return verdict


async def verdict(episode: EpisodeClient, row: dict[str, Any], final_text: str = "") -> dict[str, Any]:
    """Verify the episode, as ``EpisodeClient.verify`` does, and return its verdict on either nemo-gym."""
    return read_verdict(await episode.post("/verify", {**row, "response": episode.transcript.response(final_text)}))
