"""Sessions and identity links, written inside the events flush transaction.

A visitor's events with gaps of at most 30 minutes form a session. The session's
source, channel, referrer, landing page and UTM values are those of its earliest
event (an earlier event flushed late, say by another worker, takes that place).
A visitor id comes from a daily salt, so at midnight UTC the same person gets a new
one: each event also carries the id under the previous day's salt, and an open
session found under that id continues (and is recorded under the new id as well).

`$identify` events open no session; they link their uid to the visitor. The
customer_first_touch table follows every link and session change through triggers
in schema.sql, inside the same transaction.

The work is set-based per flush: one query per site loads every stored session the
batch can touch (those of its visitor ids, under today's and yesterday's salt, seen
within the session gap of its events' times), the assignment runs in memory against that
picture, kept current as sessions open and grow, and the result is written with one
executemany per kind of change.
The decisions are those of looking each visitor up in the database in turn, earliest
visitor first (tests/test_sessions_equivalence.py holds that reference and compares).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from functools import partial
from operator import itemgetter
from typing import NamedTuple

from attribution import Touch, classify_visit
from storage.connection import Connection
from storage.directory import site_hosts
from storage.sessions import (
    PROVISIONAL_SESSION_ID,
    add_session_counts,
    final_session_ids,
    first_touch_of_new_sessions,
    insert_sessions,
    link_identities,
    link_session_visitors,
    move_session_starts,
    sessions_of_visitors,
)
from vocabulary import IDENTIFY, PAGEVIEW, SESSION_GAP_MS, UTM_KEYS


class Hit(NamedTuple):
    """One event, as much of it as sessions and identity links need."""

    site_id: int
    visitor_id: int | None
    ts: int  # unix ms
    name: str  # pageview, $identify or a custom name
    url: str
    pathname: str = "/"
    referrer: str | None = None
    referrer_host: str | None = None
    utm: tuple[str | None, ...] = (None,) * len(UTM_KEYS)  # in UTM_KEYS order
    click_ids: tuple[str, ...] = ()  # names of the click-id parameters present
    uid: str | None = None
    # The same ip + ua under the previous day's salt (None when unknown).
    previous_visitor_id: int | None = None


class Landing(NamedTuple):
    """What a session's first event says about where the visit came from."""

    source: str | None
    channel: str
    referrer: str | None
    landing_page: str
    entry_path: str
    utm: tuple[str | None, ...]  # in UTM_KEYS order


# Landing(*fields) runs NamedTuple's generated __new__ in Python; a batch of new visitors
# makes one a session, so each is built from its tuple of fields in one C call.
_landing = partial(tuple.__new__, Landing)


def landing_of(hit: Hit, site_hosts: Collection[str], touches: dict | None = None) -> Landing:
    """touches: an optional memo of classify_visit for one site's hosts (pure, and
    a batch's first events share a few referrers and UTM sets)."""
    # Unpacked in one step: a NamedTuple's field names are Python-level lookups.
    _, _, _, _, url, pathname, referrer, referrer_host, utm, click_ids, _, _ = hit
    key = (referrer_host, utm, click_ids)
    touch = touches.get(key) if touches is not None else None
    if touch is None:
        touch = _touch(hit, site_hosts)
        if touches is not None:
            touches[key] = touch
    return _landing((touch.source, touch.channel, referrer or None, url, pathname, utm))


def _touch(hit: Hit, site_hosts: Collection[str]) -> Touch:
    utm = dict(zip(UTM_KEYS, hit.utm, strict=True))
    return classify_visit(hit.referrer_host, utm, hit.click_ids, site_hosts)


class _Session:
    """A session as the batch sees it: stored (loaded) or opened by this batch."""

    __slots__ = ("id", "site_id", "visitor_id", "started_at", "last_seen_at", "stored_start",
                 "visitor_ids", "pageviews", "custom_events", "landing")

    def __init__(self, id: int, site_id: int, visitor_id: int | None, started_at: int,
                 last_seen_at: int, stored_start: int | None, landing: Landing | None = None):
        self.id = id
        self.site_id = site_id
        self.visitor_id = visitor_id  # the first visitor id (new sessions only)
        self.started_at = started_at
        self.last_seen_at = last_seen_at
        self.stored_start = stored_start  # started_at in the database; None: new
        # Nearly always one or two ids: a tuple is 48 bytes where a set is 216, and a flush
        # holds one of these a visitor.
        self.visitor_ids: tuple[int, ...] = ()
        self.pageviews = 0  # added by this batch
        self.custom_events = 0
        self.landing = landing  # new sessions, and stored ones an earlier event reached


class _Visits:
    """The sessions one batch can reach, by (site, visitor id), kept current in memory."""

    def __init__(self, conn: Connection, wanted: dict[int, list]):
        """wanted: site id -> [visitor ids looked up, first ts, last ts of the lookups].

        Loaded: every stored session of those visitor ids that a lookup within the
        site's span can reach (a superset of what each lookup needs: find() decides)."""
        self.by_visitor: dict[tuple[int, int], list[_Session]] = {}
        self.new: list[_Session] = []
        # (site, visitor id, session id) a session was seen under besides its first
        self.links: list[tuple[int, int, int]] = []
        # New sessions carry provisional ids, above any stored id and in the order they
        # were opened, as their final ones are (final_ids, once the write lock is held).
        self._next_id = PROVISIONAL_SESSION_ID
        by_visitor = self.by_visitor
        for site_id, (visitors, first, last) in wanted.items():
            loaded: dict[int, _Session] = {}
            for session_id, started_at, last_seen_at, visitor in sessions_of_visitors(
                    conn, site_id, list(visitors), first - SESSION_GAP_MS,
                    last + SESSION_GAP_MS):
                session = loaded.get(session_id)
                if session is None:
                    session = loaded[session_id] = _Session(
                        session_id, site_id, None, started_at, last_seen_at, started_at)
                elif visitor in session.visitor_ids:
                    continue  # the session again, through another of its visitor ids
                session.visitor_ids += (visitor,)
                key = (site_id, visitor)
                if key in by_visitor:
                    by_visitor[key].append(session)
                else:
                    by_visitor[key] = [session]

    def find(self, site_id: int, visitor: int | None, previous: int | None,
             ts: int) -> _Session | None:
        """The open session of either visitor id around ts: the one seen last (the
        greater id on a tie), as ORDER BY last_seen_at DESC, id DESC would pick it."""
        best = None
        earliest, latest = ts - SESSION_GAP_MS, ts + SESSION_GAP_MS
        by_visitor = self.by_visitor
        for candidates in (by_visitor.get((site_id, visitor)) if visitor is not None else None,
                           by_visitor.get((site_id, previous)) if previous is not None else None):
            if not candidates:
                continue
            for session in candidates:
                if (session.last_seen_at >= earliest and session.started_at <= latest
                        and (best is None or session.last_seen_at > best.last_seen_at
                             or (session.last_seen_at == best.last_seen_at
                                 and session.id > best.id))):
                    best = session
        return best

    def open(self, key: tuple[int, int], ts: int, landing: Landing) -> _Session:
        """A new session of the visitor `key` (site, visitor id) starting at ts."""
        session = _Session(self._next_id, key[0], key[1], ts, ts, None, landing)
        self._next_id += 1
        self.new.append(session)
        # Its first visitor id is sessions.visitor_id: no session_visitors row.
        session.visitor_ids = (key[1],)
        if key in self.by_visitor:
            self.by_visitor[key].append(session)
        else:
            self.by_visitor[key] = [session]
        return session

    def link(self, session: _Session, key: tuple[int, int]) -> None:
        """Record that the session was seen under another visitor `key` (site, visitor id)."""
        session.visitor_ids += (key[1],)
        if key in self.by_visitor:
            self.by_visitor[key].append(session)
        else:
            self.by_visitor[key] = [session]
        self.links.append((key[0], key[1], session.id))

    def final_ids(self, conn: Connection, final: list[int] | None = None) -> dict[int, int]:
        """Give the new sessions their final ids (`final`, or storage.sessions.final_session_ids,
        under the write lock): provisional id -> final id."""
        if final is None:
            final = final_session_ids(conn, len(self.new))
        renamed = {}
        for session, session_id in zip(self.new, final, strict=True):
            renamed[session.id] = session.id = session_id
        self.links = [(site, visitor, renamed.get(sid, sid)) for site, visitor, sid in self.links]
        return renamed

    def write_new(self, conn: Connection) -> None:
        """The new sessions (with their final ids)."""
        # A Landing is (source, channel, referrer, landing_page, entry_path, utm): read by
        # position, and each row made by concatenating tuples, all in C.
        insert_sessions(conn, [
            (s.id, s.site_id, s.visitor_id, s.started_at, s.last_seen_at, landing[1],
             landing[0], landing[2], landing[3], landing[4]) + landing[5]
            + (s.pageviews, s.custom_events)
            for s in self.new for landing in (s.landing,)])

    def write_changes(self, conn: Connection, touched: Iterable[_Session]) -> None:
        """After write_new: earlier starts, counts and new visitor ids of stored sessions.

        The new sessions' first touches and the links go last, recomputed against final
        sessions."""
        stored = [s for s in touched if s.stored_start is not None]
        move_session_starts(conn, [
            (s.started_at, s.landing.channel, s.landing.source, s.landing.referrer,
             s.landing.landing_page, s.landing.entry_path, *s.landing.utm, s.id, s.started_at)
            for s in stored if s.landing is not None and s.started_at < s.stored_start])
        add_session_counts(conn, [
            (s.last_seen_at, s.pageviews, s.custom_events, s.id) for s in stored])
        if self.new:
            first_touch_of_new_sessions(conn, [(s.site_id, s.visitor_id) for s in self.new])
        link_session_visitors(conn, self.links)


class SessionWriter:
    """Assigns hits to sessions and records identity links on a connection in a transaction."""

    def __init__(self, site_hosts: Callable[[Connection, int], Collection[str]] | None = None):
        self._site_hosts = site_hosts or hosts_of_site

    def record(self, conn: Connection, hits: Sequence[Hit]) -> list[int | None]:
        """The session id of each hit (None for $identify and hits without a visitor)."""
        return self.decide(conn, hits).write(conn)

    def decide(self, conn: Connection, hits: Sequence[Hit]) -> SessionPlan:
        """What record() writes, decided with reads only: the flush on SQLite decides
        before it takes the write lock, and writes the plan once it holds the lock and
        the same reads give the same answers (ingest.pipeline.BatchWriter)."""
        session_ids: list[int | None] = [None] * len(hits)
        groups: dict[tuple[int, int], list[int]] = {}  # (site, visitor id) -> hit indexes
        identifies = []
        wanted: dict[int, list] = {}  # site -> [visitor ids looked up, first ts, last ts]
        for index, hit in enumerate(hits):
            # Unpacked in one step: a NamedTuple's field names are Python-level lookups.
            site_id, visitor, ts, name, _, _, _, _, _, _, uid, previous = hit
            if not visitor:
                continue
            if name == IDENTIFY:
                identifies.append(hit)
                if not (uid and previous):
                    continue
                visitor = None  # it looks up yesterday's id only
            else:
                key = (site_id, visitor)
                if key in groups:
                    groups[key].append(index)
                else:
                    groups[key] = [index]
            site = wanted.get(site_id)
            if site is None:
                site = wanted[site_id] = [set(), ts, ts]
            elif ts < site[1]:
                site[1] = ts
            elif ts > site[2]:
                site[2] = ts
            if visitor is not None:
                site[0].add(visitor)
            if previous is not None:
                site[0].add(previous)
        if not groups and not identifies:
            return SessionPlan(session_ids, None, (), [])
        visits = _Visits(conn, wanted)
        del wanted
        touched: dict[int, _Session] = {}  # stored sessions this batch changes, in order
        hosts: dict[int, tuple[Collection[str], dict]] = {}
        ordered_groups = []
        for key, indexes in groups.items():
            if len(indexes) > 1:
                indexes.sort(key=lambda i: hits[i].ts)
            ordered_groups.append((hits[indexes[0]][2], key, indexes))
        del groups
        # Earliest visitor first: a batch spanning midnight holds yesterday's id (which
        # opens the visit) and today's (which must find it through previous_visitor_id).
        ordered_groups.sort(key=itemgetter(0))
        find, open_session, link = visits.find, visits.open, visits.link
        for _, key, indexes in ordered_groups:
            site_id = key[0]
            if site_id not in hosts:
                hosts[site_id] = (self._site_hosts(conn, site_id), {})
            site_hosts, touches = hosts[site_id]
            visitor = key[1]
            current: _Session | None = None
            # current's span widened by the gap: an event within it continues current.
            low = high = 0
            for index in indexes:
                hit = hits[index]
                ts = hit[2]
                if current is None or not low <= ts <= high:
                    current = find(site_id, visitor, hit[11], ts)
                    if current is None:
                        current = open_session(key, ts, landing_of(hit, site_hosts, touches))
                    elif current.stored_start is not None:
                        touched[current.id] = current
                    if visitor not in current.visitor_ids:
                        link(current, key)
                    session_id = current.id
                if ts < current.started_at:
                    current.started_at = ts
                    current.landing = landing_of(hit, site_hosts, touches)
                if ts > current.last_seen_at:
                    current.last_seen_at = ts
                low = current.started_at - SESSION_GAP_MS
                high = current.last_seen_at + SESSION_GAP_MS
                if hit[3] == PAGEVIEW:
                    current.pageviews += 1
                else:
                    current.custom_events += 1
                session_ids[index] = session_id
        return SessionPlan(session_ids, visits, list(touched.values()),
                           self._identity_links(visits, identifies))

    @staticmethod
    def _identity_links(visits: _Visits, identifies: Iterable[Hit]) -> list[tuple]:
        rows = []
        for hit in identifies:
            if not hit.uid:
                continue
            rows.append((hit.site_id, hit.uid, hit.visitor_id, hit.ts))
            # Just after midnight the visit may still be open under yesterday's id.
            if hit.previous_visitor_id and visits.find(hit.site_id, None,
                                                       hit.previous_visitor_id, hit.ts):
                rows.append((hit.site_id, hit.uid, hit.previous_visitor_id, hit.ts))
        return rows


class SessionPlan:
    """The sessions, visitor links and `$identify` links one batch writes."""

    __slots__ = ("session_ids", "visits", "touched", "identities")

    def __init__(self, session_ids: list[int | None], visits: _Visits | None,
                 touched: list[_Session], identities: list[tuple]):
        self.session_ids = session_ids
        self.visits = visits
        self.touched = touched  # stored sessions the batch changes, in order
        self.identities = identities  # (site id, uid, visitor id, linked at)

    def write(self, conn: Connection) -> list[int | None]:
        """Write the plan (the caller holds the write lock); each hit's final session id."""
        session_ids = self.write_sessions(conn)
        self.write_changes(conn)
        return session_ids

    @property
    def new_sessions(self) -> int:
        """How many sessions the plan opens."""
        return len(self.visits.new) if self.visits is not None else 0

    def write_sessions(self, conn: Connection,
                       final_ids: list[int] | None = None) -> list[int | None]:
        """The first part of write(): the new sessions, with their final ids (`final_ids`
        when the caller took them already, one for each of new_sessions, ascending); each
        hit's final session id."""
        session_ids = self.session_ids
        visits = self.visits
        if visits is not None:
            renamed = visits.final_ids(conn, final_ids)
            if renamed:
                session_ids = [renamed.get(sid, sid) for sid in session_ids]
            visits.write_new(conn)
        return session_ids

    def write_changes(self, conn: Connection) -> None:
        """The rest of write(), after write_sessions: stored sessions' changes, visitor
        links and identity links. Nothing is read back (the flush pipelines them)."""
        if self.visits is not None:
            self.visits.write_changes(conn, self.touched)
        link_identities(conn, self.identities)


def hosts_of_site(conn: Connection, site_id: int) -> frozenset[str]:
    return frozenset(site_hosts(conn, site_id))
