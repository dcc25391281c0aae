"""What grading reads of an agentenv instance (``Asked``): its state, its extensions' scores.

State criteria read the merged ``data/get``; extension criteria call the grade extension the card advertises. The
server grades (``_grading.evaluate``, with the final text), never the instance. Anything the instance fails to answer
raises, and the runtime masks the episode (``verifier_error`` or the transport's kind): a grader that ran and said 0
is a genuine 0, one that could not run is not.
"""

from __future__ import annotations

from typing import Any

from .._backend import Catalog
from .._grading import Asked, Observation, extension_score, merge_state

__all__ = ["observe"]


async def observe(client: Any, catalog: Catalog, asked: Asked) -> Observation:
    state = merge_state(await client.get()) if asked.state else None
    scores: dict[int, float] = {}
    for index, criterion in asked.extensions.items():
        answer = await client.call_extension(catalog, criterion.uri, criterion.method, criterion.params)
        scores[index] = extension_score(criterion, answer)
    return Observation(state=state, extension_scores=scores)
