"""Every error the API returns, as one JSON shape, mapped from exceptions in one place.

Error body (every 4xx and 5xx, including FastAPI's own validation errors and unknown routes)::

    {"error": {"code": "not_found", "message": "study 7 not found", "details": []}}

``details`` lists field-level problems for validation errors: ``{"field": "budget.trials",
"loc": ["body", "budget", "trials"], "message": "...", "type": "..."}``.

Domain errors from :mod:`tuner.errors` map to HTTP here and nowhere else: ``ValidationError``
422, ``NotFoundError`` 404, ``ConflictError`` and ``InvalidStateError`` 409,
``ClusterUnavailableError`` 503.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.errors import (
    ClusterUnavailableError,
    ConflictError,
    InvalidStateError,
    NotFoundError,
    StagetuneError,
    ValidationError,
)

log = logging.getLogger(__name__)

#: Domain error class -> (HTTP status, error code). Checked in order; the first match wins.
DOMAIN_ERRORS: tuple[tuple[type[StagetuneError], int, str], ...] = (
    (ValidationError, 422, "validation_error"),
    (NotFoundError, 404, "not_found"),
    (InvalidStateError, 409, "invalid_state"),
    (ConflictError, 409, "conflict"),
    (ClusterUnavailableError, 503, "unavailable"),
)

#: Error codes of HTTP statuses raised by the framework or by ``ApiError`` without a code.
STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(StarletteHTTPException):
    """An HTTP error raised by an endpoint, with a machine-readable ``code``."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        code: str | None = None,
        details: Sequence[Mapping[str, Any]] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status_code=status_code, detail=message, headers=dict(headers or {}))
        self.code = code or STATUS_CODES.get(status_code, "error")
        self.message = message
        self.details = [dict(d) for d in details]


class RequestTooLargeError(ApiError):
    """The request body is larger than ``settings.max_request_bytes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"request body too large: the limit is {limit} bytes",
            code="request_too_large",
        )


def error_body(
    code: str, message: str, details: Iterable[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The JSON body of every error response."""
    return {"error": {"code": code, "message": message, "details": [dict(d) for d in details]}}


def error_response(
    status_code: int,
    code: str,
    message: str,
    details: Iterable[Mapping[str, Any]] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        jsonable_encoder(error_body(code, message, details)),
        status_code=status_code,
        headers=dict(headers) if headers else None,
    )


def field_path(loc: Sequence[int | str]) -> str:
    """``("body", "budget", "trials")`` -> ``"budget.trials"``; list indexes as ``[i]``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def validation_details(errors: Iterable[Any]) -> list[dict[str, Any]]:
    """Pydantic / FastAPI error dicts -> ``details`` entries (field path, reason, type)."""
    details = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        details.append(
            {
                "field": field_path(loc),
                "loc": list(loc),
                "message": str(err.get("msg", "")),
                "type": str(err.get("type", "")),
            }
        )
    return details


def validation_message(details: Sequence[Mapping[str, Any]]) -> str:
    """One line naming each invalid field and why."""
    parts = [
        f"{d['field']}: {d['message']}" if d.get("field") else str(d["message"]) for d in details
    ]
    return "invalid request: " + "; ".join(parts) if parts else "invalid request"


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc, ApiError):
        code, message, details = exc.code, exc.message, exc.details
    else:
        code = STATUS_CODES.get(exc.status_code, "error")
        default = _reason(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) and exc.detail else default
        if exc.status_code == 404 and message == default:
            message = f"no such resource: {request.method} {request.url.path}"
        elif exc.status_code == 405 and message == default:
            message = f"method {request.method} not allowed on {request.url.path}"
        details = []
    return error_response(exc.status_code, code, message, details, exc.headers)


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = validation_details(exc.errors())
    return error_response(422, "validation_error", validation_message(details), details)


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    for cls, status, code in DOMAIN_ERRORS:
        if isinstance(exc, cls):
            return error_response(status, code, str(exc))
    return error_response(400, "bad_request", str(exc))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error")


def _reason(status_code: int) -> str:
    try:
        return HTTPStatus(status_code).phrase
    except ValueError:
        return "error"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every exception into the JSON error body."""
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StagetuneError, _domain_error)
    # Exception handlers for `Exception` run in ServerErrorMiddleware (outermost), which still
    # re-raises after responding so the server logs it; the client gets the JSON body.
    app.add_exception_handler(Exception, _unexpected)
