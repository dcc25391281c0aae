"""mcp's check of tool results against their output schemas, with each schema's validator built once.

mcp's low-level server validates every tool result against the tool's output schema with ``jsonschema.validate``,
which checks the schema itself and builds a validator on every call: most of an in-process tool call's CPU (gridsim's
``gridsim_look``, profiled; ``benchmarks/README.md`` has the numbers), the same in an instance process. ``install()``
replaces the ``jsonschema`` name inside ``mcp.server.lowlevel.server`` with an object whose ``validate`` keeps each
schema's validator and raises exactly what ``jsonschema.validate`` raises (the same ``best_match`` error; an invalid
schema raises ``SchemaError`` every time and is never kept). Everything else is jsonschema's own.

Validators are found by the schema object (one dict lookup a call) and shared by schemas with the same JSON text:
hundreds of in-process instances of one environment, each its own FastMCP server with its own copies of the same
schemas, share one validator per tool. Both maps are bounded. Written here because mcp has no hook for it (its
issue #3133 asks for one); ``install`` does nothing when mcp stops calling ``jsonschema.validate`` there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

import jsonschema
from jsonschema import exceptions, validators

__all__ = ["install", "prepare"]

_KEPT = 16384  # schema objects remembered; past it the map starts again (a validator is rebuilt once per schema)


class _CachingJsonschema:
    ValidationError = jsonschema.ValidationError
    SchemaError = jsonschema.SchemaError

    def __init__(self) -> None:
        self._by_object: dict[int, tuple[Any, Any]] = {}  # id(schema) -> (the schema, kept alive; its validator)
        self._by_text: dict[str, Any] = {}

    def validate(self, instance: Any, schema: Any, cls: Any = None, *args: Any, **kwargs: Any) -> None:
        if cls is not None or args or kwargs:
            jsonschema.validate(instance, schema, cls, *args, **kwargs)
            return
        known = self._by_object.get(id(schema))
        if known is None or known[0] is not schema:
            known = (schema, self._validator(schema))
            if len(self._by_object) >= _KEPT:
                self._by_object.clear()
            self._by_object[id(schema)] = known
        error = exceptions.best_match(known[1].iter_errors(instance))
        if error is not None:
            raise error

    def _validator(self, schema: Any) -> Any:
        try:
            text = json.dumps(schema, sort_keys=True)
        except (TypeError, ValueError):
            text = None
        validator = self._by_text.get(text) if text is not None else None
        if validator is None:
            validator_class = validators.validator_for(schema)
            validator_class.check_schema(schema)  # SchemaError, as jsonschema.validate raises it; nothing kept
            validator = validator_class(schema)
            if text is not None:
                if len(self._by_text) >= _KEPT:
                    self._by_text.clear()
                self._by_text[text] = validator
        return validator

    def __getattr__(self, name: str) -> Any:
        return getattr(jsonschema, name)


def prepare(schemas: Iterable[Any]) -> None:
    """Build these schemas' validators now, where ``install`` took effect, kept by their JSON text: a template process
    does it for the tools of the environment it constructed, so the instances it forks start with them (an invalid
    schema is left for the call that meets it, which raises as jsonschema does)."""
    from mcp.server.lowlevel import server as lowlevel

    cache = getattr(lowlevel, "jsonschema", None)
    if isinstance(cache, _CachingJsonschema):
        for schema in schemas:
            with contextlib.suppress(jsonschema.SchemaError):
                cache._validator(schema)


def install() -> bool:
    """Swap in the caching validator for mcp's result checks, once per process; False when mcp does not use
    ``jsonschema`` there (a newer mcp), in which case nothing changes."""
    from mcp.server.lowlevel import server as lowlevel

    current = getattr(lowlevel, "jsonschema", None)
    if isinstance(current, _CachingJsonschema):
        return True
    if current is not jsonschema:
        return False
    lowlevel.jsonschema = _CachingJsonschema()  # type: ignore[attr-defined]
    return True
