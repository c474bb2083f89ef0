"""The events flush's session step as it was before it became set-based (an oracle).

ReferenceSessionWriter looks each visitor up in the database in turn, with several
statements per visitor; reference_write_batch is the whole flush write of that time
(every event hashed under yesterday's salt too, then one executemany of full rows).
tests/test_sessions_equivalence.py runs them side by side with attribution.sessions'
SessionWriter and ingest.pipeline.write_batch and requires the same ids and rows. Do not
"fix" them: their behaviour is the reference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from attribution import classify_visit
from attribution.sessions import (
    IDENTIFY,
    PAGEVIEW,
    SESSION_GAP_MS,
    UTM_KEYS,
    Hit,
    Landing,
    hosts_of_site,
)
from enrichment.visitor import visitor_id
from storage.connection import Connection
from storage.events import EVENT_COLUMNS
from storage.sessions import first_touch_of_new_sessions
from storage.usage import ADD_USAGE

CLICK_ID_KEYS = ("gclid", "gbraid", "wbraid", "msclkid", "fbclid")
INSERT_EVENTS = (
    "INSERT INTO events (site_id, ts, name, visitor_id, pathname, url, hostname, referrer,"
    " referrer_host, title, width, language, uid, props, country, browser, os, device,"
    " utm_source, utm_medium, utm_campaign, utm_term, utm_content, gclid, gbraid, wbraid,"
    " msclkid, fbclid, anonymous, session_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
    " ?)"
)


def landing_of(hit: Hit, site_hosts: Collection[str]) -> Landing:
    utm = dict(zip(UTM_KEYS, hit.utm, strict=True))
    touch = classify_visit(hit.referrer_host, utm, hit.click_ids, site_hosts)
    return Landing(touch.source, touch.channel, hit.referrer or None, hit.url, hit.pathname,
                   hit.utm)


@dataclass
class _Session:
    id: int
    started_at: int
    last_seen_at: int
    visitor_ids: set[str]
    pageviews: int = 0
    custom_events: int = 0
    landing: Landing | None = None  # set when an event earlier than the start arrived
    new_visitor_ids: set[str] = field(default_factory=set)

    def covers(self, ts: int) -> bool:
        return self.started_at - SESSION_GAP_MS <= ts <= self.last_seen_at + SESSION_GAP_MS


_INSERT_SESSION = (
    "INSERT INTO sessions (site_id, visitor_id, started_at, last_seen_at, channel, source,"
    " referrer, landing_page, entry_path, utm_source, utm_medium, utm_campaign, utm_term,"
    " utm_content, pageviews, custom_events) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)"
)
_FIND_OPEN_SESSION = (
    "SELECT s.id, s.started_at, s.last_seen_at FROM session_links sv"
    " JOIN sessions s ON s.id = sv.session_id"
    " WHERE sv.site_id = ? AND sv.visitor_id IN (?, ?)"
    " AND s.last_seen_at >= ? AND s.started_at <= ?"
    " ORDER BY s.last_seen_at DESC, s.id DESC LIMIT 1"
)
_UPDATE_COUNTS = (
    "UPDATE sessions SET last_seen_at = max(last_seen_at, ?), pageviews = pageviews + ?,"
    " custom_events = custom_events + ? WHERE id = ?"
)
_UPDATE_LANDING = (
    "UPDATE sessions SET started_at = ?, channel = ?, source = ?, referrer = ?, landing_page = ?,"
    " entry_path = ?, utm_source = ?, utm_medium = ?, utm_campaign = ?, utm_term = ?,"
    " utm_content = ? WHERE id = ? AND started_at > ?"
)


class ReferenceSessionWriter:
    """Assigns hits to sessions and records identity links on a connection in a transaction."""

    def __init__(self, site_hosts: Callable[[Connection, int], Collection[str]]):
        self._site_hosts = site_hosts

    def record(self, conn: Connection, hits: Sequence[Hit]) -> list[int | None]:
        """The session id of each hit (None for $identify and hits without a visitor)."""
        session_ids: list[int | None] = [None] * len(hits)
        groups: dict[tuple[int, str], list[int]] = defaultdict(list)
        identifies = []
        for index, hit in enumerate(hits):
            if not hit.visitor_id:
                continue
            if hit.name == IDENTIFY:
                identifies.append(hit)
            else:
                groups[(hit.site_id, hit.visitor_id)].append(index)
        hosts: dict[int, Collection[str]] = {}
        by_visitor = [sorted(indexes, key=lambda i: hits[i].ts) for indexes in groups.values()]
        # Earliest visitor first: a batch spanning midnight holds yesterday's id (which
        # opens the visit) and today's (which must find it through previous_visitor_id).
        for ordered in sorted(by_visitor, key=lambda indexes: hits[indexes[0]].ts):
            site_id = hits[ordered[0]].site_id
            if site_id not in hosts:
                hosts[site_id] = self._site_hosts(conn, site_id)
            self._assign(conn, hits, ordered, hosts[site_id], session_ids)
        self._link_identities(conn, identifies)
        return session_ids

    def _assign(self, conn, hits: Sequence[Hit], ordered: list[int], site_hosts,
                session_ids: list[int | None]) -> None:
        current: _Session | None = None
        for index in ordered:
            hit = hits[index]
            if current is None or not current.covers(hit.ts):
                if current is not None:
                    _save(conn, hit.site_id, current)
                current = _find_open(conn, hit) or _create(conn, hit, site_hosts)
            if hit.ts < current.started_at:
                current.started_at = hit.ts
                current.landing = landing_of(hit, site_hosts)
            current.last_seen_at = max(current.last_seen_at, hit.ts)
            if hit.name == PAGEVIEW:
                current.pageviews += 1
            else:
                current.custom_events += 1
            if hit.visitor_id not in current.visitor_ids:
                current.visitor_ids.add(hit.visitor_id)
                current.new_visitor_ids.add(hit.visitor_id)
            session_ids[index] = current.id
        if current is not None:
            _save(conn, hits[ordered[0]].site_id, current)

    @staticmethod
    def _link_identities(conn: Connection, identifies: Iterable[Hit]) -> None:
        rows = []
        for hit in identifies:
            if not hit.uid:
                continue
            rows.append((hit.site_id, hit.uid, hit.visitor_id, hit.ts))
            # Just after midnight the visit may still be open under yesterday's id.
            if hit.previous_visitor_id and _find_open(conn, hit, only_previous=True):
                rows.append((hit.site_id, hit.uid, hit.previous_visitor_id, hit.ts))
        conn.executemany(
            "INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            rows,
        )


def _find_open(conn: Connection, hit: Hit, only_previous: bool = False) -> _Session | None:
    today = None if only_previous else hit.visitor_id
    row = conn.execute(
        _FIND_OPEN_SESSION,
        (hit.site_id, today, hit.previous_visitor_id,
         hit.ts - SESSION_GAP_MS, hit.ts + SESSION_GAP_MS),
    ).fetchone()
    if row is None:
        return None
    visitors = {
        r[0] for r in conn.execute(
            "SELECT visitor_id FROM session_links WHERE session_id = ?", (row[0],))
    }
    return _Session(row[0], row[1], row[2], visitors)


def _create(conn: Connection, hit: Hit, site_hosts) -> _Session:
    landing = landing_of(hit, site_hosts)
    session_id = conn.execute(
        _INSERT_SESSION,
        (hit.site_id, hit.visitor_id, hit.ts, hit.ts, landing.channel, landing.source,
         landing.referrer, landing.landing_page, landing.entry_path, *landing.utm),
    ).lastrowid
    first_touch_of_new_sessions(conn, [(hit.site_id, hit.visitor_id)])
    return _Session(session_id, hit.ts, hit.ts, {hit.visitor_id})  # sessions.visitor_id


def _save(conn: Connection, site_id: int, session: _Session) -> None:
    if session.landing is not None:
        landing = session.landing
        conn.execute(
            _UPDATE_LANDING,
            (session.started_at, landing.channel, landing.source, landing.referrer,
             landing.landing_page, landing.entry_path, *landing.utm, session.id,
             session.started_at),
        )
        session.landing = None
    conn.execute(
        _UPDATE_COUNTS,
        (session.last_seen_at, session.pageviews, session.custom_events, session.id),
    )
    session.pageviews = session.custom_events = 0
    conn.executemany(
        "INSERT INTO session_visitors (site_id, visitor_id, session_id) VALUES (?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        [(site_id, visitor_id, session.id) for visitor_id in sorted(session.new_visitor_ids)],
    )
    session.new_visitor_ids.clear()



def reference_write_batch(conn: Connection, batch) -> None:
    """The flush write before the set-based session step (on rows in EVENT_COLUMNS order)."""
    rows = [[*row, None] for row in batch.rows]  # EventRow and its session id
    _assign_sessions(conn, rows, batch, EVENT_COLUMNS)
    conn.executemany(INSERT_EVENTS, rows)
    for (account_id, month), events in batch.usage.items():
        total = conn.execute(ADD_USAGE, (account_id, month, events,
                                         batch.anonymous_usage.get((account_id, month), 0))
                             ).fetchone()[0]
        batch.usage_totals[(account_id, month)] = total


_writer = ReferenceSessionWriter(hosts_of_site)


def _assign_sessions(conn: Connection, rows: list[list], batch,
                     columns: Sequence[str]) -> None:
    if not rows:
        return
    at = {name: index for index, name in enumerate(columns)}
    previous = _previous_visitor_ids(conn, rows, batch)
    hits = []
    for row, previous_visitor in zip(rows, previous, strict=True):
        hits.append(Hit(
            site_id=row[at["site_id"]],
            visitor_id=row[at["visitor_id"]],
            ts=row[at["ts"]],
            name=row[at["name"]],
            url=row[at["url"]],
            pathname=row[at["pathname"]],
            referrer=row[at["referrer"]],
            referrer_host=row[at["referrer_host"]],
            utm=tuple(row[at[key]] for key in UTM_KEYS),
            click_ids=tuple(key for key in CLICK_ID_KEYS if row[at[key]]),
            uid=row[at["uid"]],
            previous_visitor_id=previous_visitor,
        ))
    session_column = at["session_id"]
    for row, session_id in zip(rows, _writer.record(conn, hits), strict=True):
        row[session_column] = session_id


def _previous_visitor_ids(conn: Connection, rows: list[list],
                          batch) -> list[int | None]:
    events = [(unit, event) for unit in batch.units for event in unit.events]
    if len(events) != len(rows):
        return [None] * len(rows)
    salts: dict[int, tuple | None] = {}
    previous = []
    for unit, event in events:
        if event.ua is None or event.ip_packed is None:
            previous.append(None)
            continue
        day = unit.day - 1
        if day not in salts:
            row = conn.execute("SELECT salt, dated FROM visitor_salts WHERE day = ?",
                               (day,)).fetchone()
            salts[day] = (row[0], day if row[1] else None) if row else None
        salt = salts[day]
        previous.append(None if salt is None else visitor_id(salt[0], unit.site_id,
                                                             event.ip_packed, event.ua, salt[1]))
    return previous
