"""FastAPI's 422 answer, made safe to write for any input.

FastAPI answers a body that fails validation with 422 and the errors, each repeating the ``input`` it refused. Some
inputs cannot be written back as JSON: bytes that are not UTF-8 (a body sent as a form or with no JSON type), NaN
and Infinity (Python's parser reads them; no JSON encoder writes them). With FastAPI's own handler those turn the
422 into a 500. This handler answers the same 422, dropping only the ``input`` values it cannot write.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = ["install_validation_errors", "validation_error"]


async def validation_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    errors = [_writable(item) for item in error.errors()]
    return JSONResponse({"detail": errors}, status_code=422)


def _writable(item: dict[str, Any]) -> dict[str, Any]:
    try:
        encoded = jsonable_encoder(item)
        json.dumps(encoded, allow_nan=False, ensure_ascii=False).encode()
    except (ValueError, UnicodeError):  # ValueError covers NaN and the decode and encode errors
        encoded = jsonable_encoder({key: value for key, value in item.items() if key not in ("input", "ctx")})
        encoded["input"] = "(not repeated: it cannot be written as JSON text)"
    result: dict[str, Any] = encoded
    return result


def install_validation_errors(app: Any) -> None:
    app.exception_handlers[RequestValidationError] = validation_error
