"""Grading an agentenv episode: the task's criteria, with what they need read from the instance.

State criteria read the merged ``data/get``; extension criteria call the grade extension the card advertises;
response criteria read the final assistant text. The combination is ``_grading``'s, a pure function of what is read
here. Anything the instance fails to answer raises, and the runtime masks the episode (``verifier_error`` or the
transport's kind): a grader that ran and said 0 is a genuine 0, one that could not run is not.
"""

from __future__ import annotations

from typing import Any

from .._backend import Catalog
from .._grading import Outcome, evaluate, extension_score, merge_state
from .._tasks import ExtensionCriterion, StateCriterion, Task

__all__ = ["grade"]


async def grade(client: Any, catalog: Catalog, task: Task, final_text: str) -> Outcome:
    grading = task.grading
    state = None
    if any(isinstance(criterion, StateCriterion) for criterion in grading.criteria):
        state = merge_state(await client.get())
    scores: dict[int, float] = {}
    for index, criterion in enumerate(grading.criteria):
        if isinstance(criterion, ExtensionCriterion):
            answer = await client.call_extension(catalog, criterion.uri, criterion.method, criterion.params)
            scores[index] = extension_score(criterion, answer)
    return evaluate(grading, state=state, extension_scores=scores, final_text=final_text)
