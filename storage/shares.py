"""Read-only shared links to a site's dashboard. The token is stored as its SHA-256 digest."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from storage.db import Database
from storage.directory import NotFound, _iso, hash_secret
from storage.statements import statement

_SITE_ID = statement("SELECT id FROM sites WHERE public_id = ?")
_INSERT_LINK = statement(
    "INSERT INTO shared_links (public_id, site_id, token_hash, revenue, created_at)"
    " VALUES (?, ?, ?, ?, ?)")
_LIVE_LINK_BY_TOKEN = statement(
    "SELECT l.public_id, l.site_id, s.public_id, l.revenue FROM shared_links l"
    " JOIN sites s ON s.id = l.site_id WHERE l.token_hash = ? AND l.revoked_at IS NULL")
_LINK_BY_ID_OR_TOKEN = statement(
    "SELECT id, public_id, revoked_at FROM shared_links"
    " WHERE public_id = ? OR token_hash = ?")
_REVOKE_LINK = statement("UPDATE shared_links SET revoked_at = ? WHERE id = ?")
_LINKS = statement(
    "SELECT l.public_id, s.public_id, l.revenue, l.created_at, l.revoked_at"
    " FROM shared_links l JOIN sites s ON s.id = l.site_id"
    " WHERE ? IS NULL OR s.public_id = ? ORDER BY l.id")


@dataclass(frozen=True)
class SharedLink:
    public_id: str
    site_id: int
    site_public_id: str
    revenue: bool


class SharedLinks:
    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes

    def create(self, site_public_id: str, revenue: bool) -> dict:
        token = base64.urlsafe_b64encode(self.random_bytes(24)).decode("ascii")
        public_id = "share_" + base64.b32encode(self.random_bytes(10)).decode("ascii").lower()
        with self.db.transaction() as conn:
            row = conn.execute(_SITE_ID,
                               (site_public_id,)).fetchone()
            if row is None:
                raise NotFound(f"no site {site_public_id}")
            conn.execute(
                _INSERT_LINK,
                (public_id, row[0], hash_secret(token), int(revenue), int(self.clock() * 1000)))
        return {"id": public_id, "token": token, "site": site_public_id, "revenue": revenue}

    def find(self, token: str) -> SharedLink | None:
        row = self.db.conn().execute(
            _LIVE_LINK_BY_TOKEN,
            (hash_secret(token),)).fetchone()
        return None if row is None else SharedLink(row[0], row[1], row[2], bool(row[3]))

    def revoke(self, id_or_token: str) -> dict:
        """Revoke by the link's id (share_…) or by its token."""
        with self.db.transaction() as conn:
            row = conn.execute(
                _LINK_BY_ID_OR_TOKEN,
                (id_or_token, hash_secret(id_or_token))).fetchone()
            if row is None:
                raise NotFound("no shared link with that id or token")
            if row[2] is None:
                conn.execute(_REVOKE_LINK,
                             (int(self.clock() * 1000), row[0]))
        return {"id": row[1], "revoked": True}

    def list(self, site_public_id: str | None = None) -> list[dict]:
        rows = self.db.conn().execute(
            _LINKS,
            (site_public_id, site_public_id))
        return [{"id": r[0], "site": r[1], "revenue": bool(r[2]), "created_at": _iso(r[3]),
                 "revoked": r[4] is not None} for r in rows]
