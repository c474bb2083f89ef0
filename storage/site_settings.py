"""What a site's settings page changes and shows: hostnames, and the last event received."""

from __future__ import annotations

from storage.db import Database
from storage.directory import InvalidArgument, normalize_host
from storage.statements import statement

_ADD_HOST = statement("INSERT OR IGNORE INTO site_hosts (site_id, host) VALUES (?, ?)")
_HOSTS_OF_SITE = statement("SELECT host FROM site_hosts WHERE site_id = ?")
_DELETE_HOST = statement("DELETE FROM site_hosts WHERE site_id = ? AND host = ?")
_LAST_EVENT = statement(
    "SELECT ts, name, url FROM events WHERE site_id = ? ORDER BY ts DESC, id DESC LIMIT 1")


_HAS_EVENTS = statement("SELECT 1 FROM events WHERE site_id = ? LIMIT 1")


class SiteSettings:
    def __init__(self, db: Database):
        self.db = db

    def add_host(self, site_id: int, host: str) -> str:
        host = normalize_host(host)
        with self.db.transaction() as conn:
            conn.execute(_ADD_HOST,
                         (site_id, host))
        return host

    def remove_host(self, site_id: int, host: str) -> None:
        with self.db.transaction() as conn:
            hosts = [r[0] for r in conn.execute(
                _HOSTS_OF_SITE, (site_id,))]
            if host in hosts and len(hosts) == 1:
                raise InvalidArgument("a site needs at least one hostname: add another first")
            conn.execute(_DELETE_HOST,
                         (site_id, host))

    def has_events(self, site_id: int) -> bool:
        """Whether any event of the site is stored (the install check: one index probe)."""
        return self.db.conn().execute(_HAS_EVENTS,
                                      (site_id,)).fetchone() is not None

    def last_event(self, site_id: int) -> tuple[int, str, str] | None:
        """(unix ms, event name, URL) of the site's latest stored event (of those at the
        same instant, the last stored, whatever order a restored copy keeps its rows in)."""
        return self.db.conn().execute(
            _LAST_EVENT,
            (site_id,)).fetchone()
