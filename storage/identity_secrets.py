"""Each site's identity secret (site_identity_secrets): the key under which the site's server
signs user ids for the browser's `$identify` (attribution/identity.py). Tally computes the
HMAC itself, so the key is stored as it is, like browser_id_key, and shown only once, when
it is made."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Callable

from storage.db import Database
from storage.statements import statement

SECRET_PREFIX = "tis_"
SECRET_BYTES = 32


_SITE_HAS_SECRET = statement(
    "SELECT 1 FROM site_identity_secrets WHERE site_id = ?")
_UPSERT_SECRET = statement(
    "INSERT INTO site_identity_secrets (site_id, secret, created_at) VALUES (?, ?, ?)"
    " ON CONFLICT (site_id) DO UPDATE SET secret = excluded.secret,"
    " created_at = excluded.created_at")
_SITE_SECRET = statement("SELECT secret FROM site_identity_secrets WHERE site_id = ?")


def new_secret(random_bytes: Callable[[int], bytes]) -> str:
    """tis_ and 43 URL-safe base64 characters (256 random bits)."""
    text = base64.urlsafe_b64encode(random_bytes(SECRET_BYTES)).decode("ascii").rstrip("=")
    return SECRET_PREFIX + text


def replace_secret(db: Database, site_id: int, secret: str, now_ms: int) -> bool:
    """Store the site's secret, replacing any; True when one was replaced."""
    with db.transaction() as conn:
        before = conn.execute(_SITE_HAS_SECRET,
                              (site_id,)).fetchone()
        conn.execute(
            _UPSERT_SECRET, (site_id, secret, now_ms))
    return before is not None


def site_secret(conn: sqlite3.Connection, site_id: int) -> str | None:
    row = conn.execute(_SITE_SECRET,
                       (site_id,)).fetchone()
    return row[0] if row else None
