"""A site's named funnels (schema version 20): a name and the list of its steps, as
GET /api/v1/stats/funnel takes them. The steps are checked before they get here
(reports.funnels.steps); this module only keeps them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import orjson

from storage.db import Database
from storage.directory import InvalidArgument

# Enough for any site's dashboard; it bounds what a key holder can store.
MAX_FUNNELS = 100

_COUNT = "SELECT count(*) FROM funnels WHERE site_id = ?"
_FIND = "SELECT name, steps, created_at FROM funnels WHERE site_id = ? AND name = ?"
_LIST = "SELECT name, steps, created_at FROM funnels WHERE site_id = ? ORDER BY name, id"
_UPSERT = (
    "INSERT INTO funnels (site_id, name, steps, created_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (site_id, name) DO UPDATE SET steps = excluded.steps,"
    " created_at = excluded.created_at"
)
_DELETE = "DELETE FROM funnels WHERE site_id = ? AND name = ?"


def _funnel(name: str, steps: str, created_at: int) -> dict:
    return {"name": name, "steps": orjson.loads(steps),
            "created_at": datetime.fromtimestamp(created_at / 1000, UTC)
            .isoformat(timespec="seconds").replace("+00:00", "Z")}


class Funnels:
    def __init__(self, db: Database, clock: Callable[[], float]):
        self.db = db
        self.clock = clock

    def save(self, site_id: int, name: str, steps: list[str]) -> dict:
        """Store the funnel under its name, replacing the site's funnel of that name."""
        with self.db.transaction() as conn:
            exists = conn.execute(_FIND, (site_id, name)).fetchone() is not None
            if not exists and conn.execute(_COUNT, (site_id,)).fetchone()[0] >= MAX_FUNNELS:
                raise InvalidArgument(
                    f"a site keeps at most {MAX_FUNNELS} funnels: delete one first")
            conn.execute(_UPSERT, (site_id, name, orjson.dumps(steps).decode(),
                                   int(self.clock() * 1000)))
            return _funnel(*conn.execute(_FIND, (site_id, name)).fetchone())

    def find(self, site_id: int, name: str) -> dict | None:
        row = self.db.conn().execute(_FIND, (site_id, name)).fetchone()
        return None if row is None else _funnel(*row)

    def list(self, site_id: int) -> list[dict]:
        return [_funnel(*row) for row in self.db.conn().execute(_LIST, (site_id,))]

    def delete(self, site_id: int, name: str) -> bool:
        """Whether there was such a funnel."""
        with self.db.transaction() as conn:
            return conn.execute(_DELETE, (site_id, name)).rowcount > 0
