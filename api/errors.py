"""Every error body Tally sends is built here: {"ok": false, "error": {"code", "message"}}."""

from __future__ import annotations

import logging

import falcon
import orjson

from reports.service import too_expensive
from storage.db import ReadBudgetExceeded, StorageBusy

log = logging.getLogger("tally")

CODES_BY_STATUS = {
    400: "invalid_input",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "invalid_input",
    429: "quota_exceeded",
    503: "rate_limited",
}


class ApiError(Exception):
    """An answer other than success, carried up to the one handler that writes it."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def invalid_input(message: str) -> ApiError:
    return ApiError(400, "invalid_input", message)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "invalid_input", f"request body is larger than {limit} bytes")


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def rate_limited(message: str = "the ingest queue is full; retry after 2 seconds") -> ApiError:
    return ApiError(503, "rate_limited", message, {"Retry-After": "2"})


def quota_exceeded(retry_after: int, message: str | None = None) -> ApiError:
    return ApiError(
        429,
        "quota_exceeded",
        message or "monthly event quota exceeded; it resets at the start of next month (UTC)",
        {"Retry-After": str(retry_after)},
    )


def too_many_requests(retry_after: int) -> ApiError:
    """A client address past its request rate (POST /api/v1/collect): not the quota."""
    return ApiError(429, "too_many_requests",
                    "too many requests from this address; retry after Retry-After seconds",
                    {"Retry-After": str(retry_after)})


def error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"ok": False, "error": {"code": code, "message": message}})


def _write(resp: falcon.Response, status: int, code: str, message: str, headers: dict) -> None:
    resp.status = status
    resp.content_type = "application/json"
    resp.data = error_body(code, message)
    for name, value in headers.items():
        resp.set_header(name, value)


def handle_api_error(req, resp, exc: ApiError, params) -> None:
    _write(resp, exc.status, exc.code, exc.message, exc.headers)


def handle_http_error(req, resp, exc: falcon.HTTPError, params) -> None:
    """Errors Falcon raises itself: unknown route, wrong method, bad headers."""
    status = exc.status_code
    code = CODES_BY_STATUS.get(status, "internal_error" if status >= 500 else "invalid_input")
    if status == 404:
        message = f"no such resource: {req.path}"
    elif status == 405:
        message = f"method {req.method} is not allowed on {req.path}"
    else:
        message = exc.description or exc.title or "invalid request"
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() in ("allow", "retry-after")}
    _write(resp, status, code, message, headers)


def handle_storage_busy(req, resp, exc: StorageBusy, params) -> None:
    """The database could not be reached or stayed locked past the bounded wait, wherever
    the request met it (a key lookup, a report): retry, as for a busy write."""
    log.warning("%s %s: the database is busy or unreachable: %s", req.method, req.path, exc)
    busy = rate_limited("the database is busy; retry after 2 seconds")
    _write(resp, busy.status, busy.code, busy.message, busy.headers)


def query_too_expensive(seconds: float) -> ApiError:
    """A read stopped at its budget (Config.read_budget): a retry of the same request costs
    the same, so it is not a 503 that clients retry, but 422 with how to narrow it."""
    return ApiError(422, "query_too_expensive", too_expensive(seconds))


def handle_read_budget(req, resp, exc: ReadBudgetExceeded, params) -> None:
    log.info("%s %s: stopped at its read budget of %g s", req.method, req.path, exc.seconds)
    error = query_too_expensive(exc.seconds)
    _write(resp, error.status, error.code, error.message, error.headers)


def handle_unexpected(req, resp, exc: Exception, params) -> None:
    log.error("unhandled error on %s %s", req.method, req.path, exc_info=exc)
    _write(resp, 500, "internal_error", "internal server error", {})


def install(app: falcon.App) -> None:
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(ApiError, handle_api_error)
    app.add_error_handler(StorageBusy, handle_storage_busy)
    app.add_error_handler(ReadBudgetExceeded, handle_read_budget)
