"""GET /api/v1/openapi.json: docs/openapi.yaml, served as JSON without a key.

The YAML is read and converted once, at the first request, so importing the app
opens no file.
"""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import yaml

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "docs" / "openapi.yaml"


def load_document(path: Path = OPENAPI_PATH) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


class OpenApiDocument:
    def __init__(self, path: Path = OPENAPI_PATH):
        self._path = path
        self._body: bytes | None = None
        self._lock = threading.Lock()

    def body(self) -> bytes:
        if self._body is None:
            with self._lock:
                if self._body is None:
                    self._body = orjson.dumps(load_document(self._path))
        return self._body

    def on_get(self, req, resp):
        resp.status = 200
        resp.content_type = "application/json"
        resp.data = self.body()
