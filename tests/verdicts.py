"""Reading a verdict under gymhost's rule for masked ones (``gymhost.middleware.masked_verdicts``).

By default (``masked_verdicts="refuse"``) a masked verdict is answered with an HTTP error, 410, 502 or 503, which
carries it under ``verdict``: verifiers never reads ``mask_sample`` and would train on the 0.0 of a 200. An app built
with ``masked_verdicts="answer"`` answers it as a 200 with ``mask_sample: true``. ``read_verdict`` returns the verdict
either way and fails the test when a server breaks the rule of the mode it was given.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx

from gymhost import EpisodeClient

REFUSAL_STATUSES = (410, 502, 503)


def read_verdict(response: httpx.Response, mode: Literal["refuse", "answer"] = "refuse") -> dict[str, Any]:
    """The verdict a ``/verify`` response gives, checked against the rule above."""
    body: dict[str, Any] = response.json()
    if response.status_code == 200:
        assert not (body.get("mask_sample") and mode == "refuse"), f"a masked verdict answered 200: {body}"
        return body
    assert mode == "refuse", f"/verify answered {response.status_code} where masked verdicts are answered: {body}"
    assert response.status_code in REFUSAL_STATUSES, f"/verify answered {response.status_code}: {body}"
    verdict: dict[str, Any] = body["verdict"]
    assert verdict["mask_sample"] is True, body
    assert body["failure_kind"] == verdict["failure_kind"], body
    return verdict


async def verdict(episode: EpisodeClient, row: dict[str, Any], final_text: str = "") -> dict[str, Any]:
    """Verify the episode, as ``EpisodeClient.verify`` does, and return its verdict, masked or not."""
    return read_verdict(await episode.post("/verify", {**row, "response": episode.transcript.response(final_text)}))
