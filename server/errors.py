"""HTTP errors: one exception with a status, turned into JSON by one errorhandler.

Flask's "Returning API Errors as JSON" pattern. Every error a client can cause leaves the server as
``{"error": {"status": 400, "message": "..."}}``; nothing else (no HTML page, no traceback) does.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from pipeline.errors import RlpipeError, SchemaError, StorageError

_log = logging.getLogger("rlpipe.server")


class ApiError(RlpipeError):
    """A request the server refuses, with the status that fits and a message that says why."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def bad_request(field: str, expected: str, got: Any) -> ApiError:
    return ApiError(400, f"field '{field}': expected {expected}, got {got}")


def storage_refused(error: StorageError, retry_after: int) -> ApiError:
    """503 for a write the dataset's disk refused: the cause, and when to try again."""
    return ApiError(
        503,
        f"{error.reason}; steps are not being stored; retry after {retry_after} s",
        retry_after=retry_after,
    )


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"status": status, "message": message}}


def error_answer(error: Exception) -> tuple[int, dict[str, Any], int | None]:
    """(status, JSON body, Retry-After) for any exception: the one mapping both the Flask routes
    and the WSGI fast path answer with. Unexpected errors are logged, never shown."""
    if isinstance(error, ApiError):
        return error.status, error_body(error.status, error.message), error.retry_after
    if isinstance(error, SchemaError):
        return 400, error_body(400, str(error).strip()), None
    if isinstance(error, HTTPException):
        status = error.code or 500
        return status, error_body(status, _http_message(error)), None
    _log.exception("internal error")
    return 500, error_body(500, "internal server error; the server log has the details"), None


def register(app: Flask) -> None:
    """Install the one handler every error goes through."""

    @app.errorhandler(Exception)
    def _handle(error: Exception) -> Response:
        status, body, retry_after = error_answer(error)
        response = jsonify(body)
        response.status_code = status
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
        if isinstance(error, MethodNotAllowed) and error.valid_methods:  # RFC 9110, 15.5.6
            response.headers["Allow"] = ", ".join(sorted(error.valid_methods))
        return response


def _http_message(error: HTTPException) -> str:
    if error.code == 413:
        return "request body too large"
    if error.code == 404:
        return "no such resource; see GET /v1/openapi.json for what this server offers"
    if error.code == 405:
        return "method not allowed on this resource; see GET /v1/openapi.json"
    return str(error.description or error.name)
