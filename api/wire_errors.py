"""gunicorn's own refusals (request line, header count or size over the limits, malformed
HTTP) in Tally's error envelope instead of gunicorn's HTML page.

gunicorn writes them through `gunicorn.util.write_error` before the application sees
the request; `install()` points that one function at ours, in each worker.
"""

from __future__ import annotations

from api.errors import CODES_BY_STATUS, error_body


def write_json_error(sock, status_int: int, reason: str, mesg: str) -> None:
    from gunicorn import util

    code = CODES_BY_STATUS.get(status_int, "internal_error" if status_int >= 500 else "invalid_input")
    if status_int >= 500:
        message = "internal server error"
    else:
        message = mesg or reason.lower()
    body = error_body(code, message)
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    from gunicorn import util

    util.write_error = write_json_error
