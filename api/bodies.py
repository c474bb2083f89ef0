"""Reading request bodies without ever reading past a limit."""

from __future__ import annotations

import falcon
import orjson

from api.errors import invalid_input, too_large


def read_limited(req: falcon.Request, limit: int) -> bytes:
    length = req.content_length
    if length is not None and length > limit:
        raise too_large(limit)
    data = req.bounded_stream.read(limit + 1)
    if len(data) > limit:
        raise too_large(limit)
    return data


def parse_json(data: bytes):
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise invalid_input(f"invalid JSON: {exc}") from None


def write_json(resp: falcon.Response, payload: dict, status: int = 200) -> None:
    resp.status = status
    resp.content_type = "application/json"
    resp.data = orjson.dumps(payload)
