"""GET /api/v1/openapi.json: docs/openapi.yaml, served as JSON without a key.

The YAML is read and converted once, at the first request, so importing the app
opens no file and imports no YAML parser.
"""

from __future__ import annotations

import threading
from importlib.resources import files
from importlib.resources.abc import Traversable

import orjson

# api/openapi.yaml is a symlink to docs/openapi.yaml, shipped as package data.
OPENAPI_PATH = files(__package__) / "openapi.yaml"


def load_document(path: Traversable = OPENAPI_PATH) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


class OpenApiDocument:
    def __init__(self, path: Traversable = OPENAPI_PATH):
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
