"""GET /js/tally.js: the tracking script, cacheable for a day (then revalidated by ETag).

The file is package data of `tracker`, read on the first request (importing the app
opens no file) and kept in memory with its gzip form, which is sent to clients that
accept it.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable

from tracker import script_bytes

CACHE_CONTROL = "public, max-age=86400, stale-while-revalidate=604800"
CONTENT_TYPE = "text/javascript; charset=utf-8"


class TrackerScript:
    def __init__(self, load: Callable[[], bytes] = script_bytes):
        self._load = load
        self._variants: dict[bool, tuple[bytes, str]] | None = None

    def variants(self) -> dict[bool, tuple[bytes, str]]:
        """gzip or not -> (body, ETag)."""
        if self._variants is None:
            plain = self._load()
            tag = hashlib.sha256(plain).hexdigest()[:20]
            self._variants = {False: (plain, f'"{tag}"'),
                              True: (gzip.compress(plain, 9, mtime=0), f'"{tag}-gz"')}
        return self._variants

    def on_get(self, req, resp):
        zipped = accepts_gzip(req.get_header("Accept-Encoding"))
        body, etag = self.variants()[zipped]
        resp.set_header("Cache-Control", CACHE_CONTROL)
        resp.set_header("ETag", etag)
        resp.set_header("Vary", "Accept-Encoding")
        resp.set_header("Cross-Origin-Resource-Policy", "cross-origin")
        if etag_matches(req.get_header("If-None-Match"), etag):
            resp.status = 304
            return
        resp.content_type = CONTENT_TYPE
        if zipped:
            resp.set_header("Content-Encoding", "gzip")
        resp.data = body

    on_head = on_get


def accepts_gzip(header: str | None) -> bool:
    for item in (header or "").split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() == "gzip":
            quality = params.replace(" ", "").lower()
            return quality not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags
