"""Sessions, the visitor ids they were seen under, identity links and first touches.

`customer_first_touch` names each customer's first-touch session and is kept current by
triggers (schema.sql). Every reader of a customer's first touch goes through
`first_touch_join`, so what "first touch" means is written once.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence

import orjson

from storage.dialect import dialect, integer_of_text
from storage.sparse import SparseInsert
from storage.statements import by_dialect, native, statement
from vocabulary import UTM_KEYS

_ALIAS = re.compile(r"[a-z][a-z0-9_]*")


_NEXT_SESSION_ID = statement("SELECT max(id) FROM sessions")


def first_touch_join(owner: str, session: str = "fs") -> str:
    """SQL to append after `FROM <table> <owner>` (a table with site_id and customer_id):
    LEFT JOINs each row to its customer's first-touch session, aliased `session`, whose
    columns are all NULL when the customer has none."""
    if not (_ALIAS.fullmatch(owner) and _ALIAS.fullmatch(session)):
        raise ValueError(f"not an alias: {owner!r}, {session!r}")
    link = f"{session}_link"
    return (
        # sql-safe: owner and session are aliases checked against _ALIAS, written by callers
        f" LEFT JOIN customer_first_touch {link} ON {link}.site_id = {owner}.site_id"
        f" AND {link}.customer_id = {owner}.customer_id"
        f" LEFT JOIN sessions {session} ON {session}.id = {link}.session_id"
    )


# The owner's columns are cast so that PostgreSQL knows their types before the parameters'.
_OWNER = " FROM (SELECT CAST(?1 AS INTEGER) AS site_id, CAST(?2 AS TEXT) AS customer_id) AS owner"
_FIRST_SESSION = statement(
    "SELECT fs.id, fs.channel, fs.source, fs.referrer, fs.landing_page, "  # noqa: S608 - fixed names
    + ", ".join(f"fs.{key}" for key in UTM_KEYS) + ", fs.started_at"  # sql-safe: fixed UTM_KEYS
    + _OWNER + first_touch_join("owner")  # sql-safe: a fixed alias
)
_FIRST_CHANNEL = statement(
    "SELECT fs.channel" + _OWNER + first_touch_join("owner")  # sql-safe: a fixed alias
)
_FIRST_CHANNELS = statement(
    "SELECT owner.customer_id, fs.channel FROM customer_first_touch owner"  # noqa: S608 - fixed alias
    + first_touch_join("owner")  # sql-safe: a fixed alias
    + " WHERE owner.site_id = ?"
)


# First touch, defined once: each customer's earliest session (by start, then id) of any
# visitor linked to it now (customers.visitor_id, or customers.user_id -> $identify ->
# visitor), NULL when there is none. The triggers of schema.sql and schema_postgres.sql keep
# customer_first_touch equal to it, row by row (tests/test_first_touch.py checks both against
# it after every kind of write). A visitor id is an integer stored as customer text: SQLite
# compares them with the column's numeric affinity, PostgreSQL through
# tally_text_as_integer, the same rule.
_FIRST_TOUCHES = (
    "SELECT c.site_id, c.customer_id, ("
    " SELECT s.id FROM sessions s WHERE s.id IN ("
    "  SELECT sv.session_id FROM session_links sv"
    "   WHERE sv.site_id = c.site_id AND sv.visitor_id = {visitor_id}"
    "  UNION ALL"
    "  SELECT sv.session_id FROM visitor_identities vi CROSS JOIN session_links sv"
    "   WHERE vi.site_id = c.site_id AND vi.uid = c.user_id"
    "   AND sv.site_id = vi.site_id AND sv.visitor_id = vi.visitor_id)"
    " ORDER BY s.started_at, s.id LIMIT 1)"
    " FROM customers c ORDER BY c.site_id, c.customer_id"
)
FIRST_TOUCHES = by_dialect(
    sqlite=_FIRST_TOUCHES.format(visitor_id="c.visitor_id"),
    postgres=_FIRST_TOUCHES.format(visitor_id="tally_text_as_integer(c.visitor_id)"))
def linked_customers(name: str) -> str:
    """A `linked (customer_id, visitor_id)` CTE, in dialect `name`: the customers of site
    ?1 linked now to a visitor id (customer.visitor_id, or customer.user_id -> $identify ->
    visitor), as first touch links them. The statements that use it declare it."""
    return (
        "linked (customer_id, visitor_id) AS ("  # noqa: S608 - a fixed fragment by dialect
        f" SELECT customer_id, {integer_of_text(name, 'visitor_id')} FROM customers"
        "  WHERE site_id = ?1 AND visitor_id IS NOT NULL"
        " UNION"
        " SELECT c.customer_id, vi.visitor_id FROM customers c"
        "  JOIN visitor_identities vi ON vi.site_id = c.site_id AND vi.uid = c.user_id"
        "  WHERE c.site_id = ?1)")


def linked_sessions() -> str:
    """A `visits (customer_id, session_id)` CTE after `linked`: the sessions of each linked
    visitor id, by their first id (sessions_site_visitor) or another (session_visitors).
    Two arms, not session_links in a join: SQLite materializes a compound view that is
    joined, every link of the site."""
    return (
        "visits (customer_id, session_id) AS ("
        " SELECT l.customer_id, o.id FROM linked l CROSS JOIN sessions o"
        "  WHERE o.site_id = ?1 AND o.visitor_id = l.visitor_id AND o.visitor_id <> 0"
        " UNION ALL"
        " SELECT l.customer_id, sv.session_id FROM linked l CROSS JOIN session_visitors sv"
        "  WHERE sv.site_id = ?1 AND sv.visitor_id = l.visitor_id)")


_STORED_FIRST_TOUCHES = statement(
    "SELECT site_id, customer_id, session_id FROM customer_first_touch"
    " ORDER BY site_id, customer_id")


def defined_first_touches(conn: sqlite3.Connection) -> list[tuple]:
    """(site id, customer id, session id or None) of every customer, by the definition."""
    return [tuple(row) for row in conn.execute(FIRST_TOUCHES[dialect(conn)])]


def stored_first_touches(conn: sqlite3.Connection) -> list[tuple]:
    """customer_first_touch's rows, as the triggers keep them."""
    return [tuple(row) for row in conn.execute(_STORED_FIRST_TOUCHES)]


def first_session(conn: sqlite3.Connection, site_id: int, customer_id: str) -> tuple | None:
    """(channel, source, referrer, landing_page, *utm values, started_at) of the customer's
    first-touch session, or None."""
    row = conn.execute(_FIRST_SESSION, (site_id, customer_id)).fetchone()
    return None if row[0] is None else row[1:]


def first_channels(conn: sqlite3.Connection, site_id: int,
                   customer_ids: Iterable[str] | None = None) -> dict[str, str | None]:
    """customer id -> first-touch channel of every customer with a first-touch row (or of
    those given: None where there is no session)."""
    if customer_ids is None:
        return dict(conn.execute(_FIRST_CHANNELS, (site_id,)).fetchall())
    return {customer: conn.execute(_FIRST_CHANNEL, (site_id, customer)).fetchone()[0]
            for customer in dict.fromkeys(customer_ids)}


# The flush's writes (attribution.sessions.SessionWriter decides them, inside the flush
# transaction) ---------------------------------------------------------------------------

# Each stored session of one site linked to one of the visitor ids (a JSON array) and
# seen within [from, to], with every visitor id it is linked to: a row per link, and a
# session linked to two of the ids comes twice. A session is found by its first visitor id
# (sessions_site_visitor) or by another (session_visitors, nearly empty); its ids are its
# own and its other links.
# PostgreSQL looks each visitor id up through the indexes, whatever its statistics say:
# the planner, with a site's rows underestimated (a table not analyzed since it grew), read
# and sorted all of the site's links and sessions for every flush, so that a flush's cost
# grew with the table. OFFSET 0 keeps each LATERAL subquery a lookup per row.
_LOAD_SESSIONS = by_dialect(
    sqlite="WITH w (value) AS MATERIALIZED (SELECT value FROM json_each(?1)),"
           " found AS MATERIALIZED ("
           "  SELECT o.id, o.started_at, o.last_seen_at, o.visitor_id"
           "   FROM w CROSS JOIN sessions o"
           "  WHERE o.site_id = ?2 AND o.visitor_id = w.value"
           "    AND o.last_seen_at >= ?3 AND +o.started_at <= ?4"  # + : sessions_site_visitor
           "  UNION ALL"
           "  SELECT o.id, o.started_at, o.last_seen_at, o.visitor_id"
           "   FROM w CROSS JOIN session_visitors f CROSS JOIN sessions o"
           "  WHERE f.site_id = ?2 AND f.visitor_id = w.value AND o.id = f.session_id"
           "    AND o.last_seen_at >= ?3 AND o.started_at <= ?4)"
           " SELECT id, started_at, last_seen_at, visitor_id FROM found"
           " UNION ALL"
           " SELECT o.id, o.started_at, o.last_seen_at, l.visitor_id"
           "  FROM found o CROSS JOIN session_visitors l WHERE l.session_id = o.id",
    postgres="SELECT o.id, o.started_at, o.last_seen_at, l.visitor_id"
             " FROM unnest(?1::bigint[]) AS w (value) CROSS JOIN LATERAL ("
             "  SELECT o.id, o.started_at, o.last_seen_at, o.visitor_id FROM sessions o"
             "  WHERE o.site_id = ?2 AND o.visitor_id = w.value"
             "    AND o.last_seen_at >= ?3 AND o.started_at <= ?4"
             "  UNION ALL"
             "  SELECT o.id, o.started_at, o.last_seen_at, o.visitor_id"
             "   FROM session_visitors f JOIN sessions o ON o.id = f.session_id"
             "  WHERE f.site_id = ?2 AND f.visitor_id = w.value"
             "    AND o.last_seen_at >= ?3 AND o.started_at <= ?4 OFFSET 0) AS o"
             " CROSS JOIN LATERAL ("
             "  SELECT o.visitor_id UNION ALL"
             "  SELECT l.visitor_id FROM session_visitors l WHERE l.session_id = o.id OFFSET 0) AS l")
# Every column of a new session; sessions' only DEFAULTs (the counts) are never None here.
NEW_SESSION_COLUMNS = (
    "id", "site_id", "visitor_id", "started_at", "last_seen_at", "channel", "source",
    "referrer", "landing_page", "entry_path", *UTM_KEYS, "pageviews", "custom_events")
_NEW_SESSIONS = SparseInsert("sessions", NEW_SESSION_COLUMNS)
_UPDATE_COUNTS = statement(
    "UPDATE sessions SET last_seen_at = max(last_seen_at, ?), pageviews = pageviews + ?,"
    " custom_events = custom_events + ? WHERE id = ?"
)
_UPDATE_LANDING = statement(
    "UPDATE sessions SET started_at = ?, channel = ?, source = ?, referrer = ?, landing_page = ?,"
    " entry_path = ?, utm_source = ?, utm_medium = ?, utm_campaign = ?, utm_term = ?,"
    " utm_content = ? WHERE id = ? AND started_at > ?"
)
_INSERT_SESSION_VISITOR = statement(
    "INSERT INTO session_visitors (site_id, visitor_id, session_id) VALUES (?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
_INSERT_IDENTITY = statement(
    "INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
    " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def sessions_of_visitors(conn: sqlite3.Connection, site_id: int, visitor_ids: list[int],
                         first: int, last: int) -> sqlite3.Cursor:
    """(session id, started_at, last_seen_at, linked visitor id) of each session of the site
    linked to one of the visitor ids and seen within [first, last]: a row per visitor id
    the session is linked to (any of its ids, not only those asked for)."""
    if dialect(conn) == "postgres":
        return conn.execute(_LOAD_SESSIONS["postgres"],
                            (_integer_array(visitor_ids), site_id, first, last))
    return conn.execute(_LOAD_SESSIONS["sqlite"], (orjson.dumps(visitor_ids), site_id, first, last))


# A batch's new sessions carry provisional ids from PROVISIONAL_SESSION_ID on while it is
# decided (above any stored id and in the order they were opened, as the final ones are:
# a flush that finds two candidate sessions picks the same one either way), so that it
# can be decided before the write lock. Their final ids are taken under the lock
# (final_session_ids): on SQLite the ones it would give, on PostgreSQL (where flushes of
# different sites run at once) from the sessions' id sequence.
PROVISIONAL_SESSION_ID = 1 << 62
# The sequence is looked up once: pg_get_serial_sequence per row cost more than nextval.
# storage.events takes the ids with its site check through this same text.
NEW_SESSION_IDS = native("postgres",
                         "WITH sequence AS MATERIALIZED (SELECT pg_get_serial_sequence('sessions',"
                         " 'id')::regclass AS id) SELECT nextval(sequence.id)"
                         " FROM sequence CROSS JOIN generate_series(1, ?) ORDER BY 1")


def next_session_id(conn: sqlite3.Connection) -> int:
    """The id a new session would get next: on SQLite the one SQLite gives (the caller
    holds the write lock), on PostgreSQL PROVISIONAL_SESSION_ID."""
    if dialect(conn) == "postgres":
        return PROVISIONAL_SESSION_ID
    return (conn.execute(_NEXT_SESSION_ID).fetchone()[0] or 0) + 1


def final_session_ids(conn: sqlite3.Connection, count: int) -> list[int]:
    """The ids of `count` new sessions, ascending; the caller holds the write lock."""
    if not count:
        return []
    if dialect(conn) == "postgres":
        return [row[0] for row in conn.execute(NEW_SESSION_IDS, (count,))]
    first = next_session_id(conn)
    return list(range(first, first + count))


def insert_sessions(conn: sqlite3.Connection, rows: Iterable[Sequence]) -> None:
    """New sessions, each in NEW_SESSION_COLUMNS order."""
    _NEW_SESSIONS.write(conn, rows)


def move_session_starts(conn: sqlite3.Connection, rows: Iterable[Sequence]) -> None:
    """(started_at, channel, source, referrer, landing_page, entry_path, *utm, id,
    started_at) each: an earlier first event gives a stored session its landing."""
    if rows:
        conn.executemany(_UPDATE_LANDING, rows)


# PostgreSQL: every stored session a batch continues in one statement (an UPDATE each,
# parsed and planned each time, cost the server ~50 us a session).
_UPDATE_COUNTS_AT_ONCE = native(
    "postgres", "UPDATE sessions SET last_seen_at = GREATEST(sessions.last_seen_at, u.last_seen_at),"
                " pageviews = sessions.pageviews + u.pageviews,"
                " custom_events = sessions.custom_events + u.custom_events"
                " FROM unnest(?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[])"
                " AS u (last_seen_at, pageviews, custom_events, id) WHERE sessions.id = u.id")


def add_session_counts(conn: sqlite3.Connection, rows: Iterable[Sequence]) -> None:
    """(last seen at, pageviews, custom events, id) each, added to a stored session; each
    session once."""
    _write_rows(conn, _UPDATE_COUNTS, _UPDATE_COUNTS_AT_ONCE, rows)


# PostgreSQL: every link of a batch in one statement, so the statement-level first-touch
# trigger (schema_postgres.sql) runs once over all of them.
_INSERT_SESSION_VISITORS = native(
    "postgres", "INSERT INTO session_visitors (site_id, visitor_id, session_id)"
                " SELECT * FROM unnest(?::bigint[], ?::bigint[], ?::bigint[])"
                " ON CONFLICT DO NOTHING")


# The tables the flush's statements and their triggers read by key (PostgreSQL): the flush
# has them analyzed as they grow (ingest/flusher.py REPLAN_FIRST).
FLUSH_READS = ("sessions", "session_visitors", "visitor_identities", "customers",
               "customer_first_touch")

# A new session's own visitor id links it to that visitor's customers (customers.visitor_id,
# or an identity link's uid): their first touches are recomputed, once for a batch's new
# sessions. session_visitors' trigger does the same for the other ids.
_REFRESH_NEW = native(
    "sqlite", "INSERT INTO first_touch_refresh (site_id, customer_id)"
              " SELECT c.site_id, c.customer_id FROM json_each(?2) AS w CROSS JOIN customers c"
              " WHERE c.site_id = ?1 AND c.visitor_id = CAST(w.value AS TEXT)"
              " UNION"
              " SELECT c.site_id, c.customer_id"
              " FROM json_each(?2) AS w CROSS JOIN visitor_identities vi CROSS JOIN customers c"
              " WHERE vi.site_id = ?1 AND vi.visitor_id = w.value"
              " AND c.site_id = vi.site_id AND c.user_id = vi.uid")
_REFRESH_NEW_AT_ONCE = native(
    "postgres", "WITH n AS MATERIALIZED (SELECT DISTINCT site_id, visitor_id"
                "  FROM unnest(?::bigint[], ?::bigint[]) AS n (site_id, visitor_id))"
                " INSERT INTO first_touch_refresh (site_id, customer_id)"
                " SELECT c.site_id, c.customer_id FROM n"
                "  JOIN customers c ON c.site_id = n.site_id AND c.visitor_id = n.visitor_id::text"
                " UNION"
                " SELECT c.site_id, c.customer_id FROM n"
                "  JOIN visitor_identities vi ON vi.site_id = n.site_id AND vi.visitor_id = n.visitor_id"
                "  JOIN customers c ON c.site_id = vi.site_id AND c.user_id = vi.uid")


def first_touch_of_new_sessions(conn: sqlite3.Connection, keys: Iterable[Sequence]) -> None:
    """(site id, visitor id) of each session just inserted: the first touches its visitor
    can move. Every writer of sessions calls it after the INSERT (schema.sql: no trigger)."""
    if dialect(conn) == "postgres":
        _write_rows(conn, None, _REFRESH_NEW_AT_ONCE, keys)
        return
    by_site: dict[int, list[int]] = {}
    for site_id, visitor_id in keys:
        by_site.setdefault(site_id, []).append(visitor_id)
    for site_id, visitors in by_site.items():
        conn.execute(_REFRESH_NEW, (site_id, orjson.dumps(visitors)))


def link_session_visitors(conn: sqlite3.Connection, links: Iterable[Sequence]) -> None:
    """(site id, visitor id, session id) each; the first-touch triggers follow them."""
    _write_rows(conn, _INSERT_SESSION_VISITOR, _INSERT_SESSION_VISITORS, links)


def _write_rows(conn: sqlite3.Connection, each, at_once, rows: Iterable[Sequence],
                column: Callable[[Iterable], object] | None = None) -> None:
    """`each` for every row on SQLite; on PostgreSQL `at_once`, one statement whose
    parameters are the rows' columns as arrays (`column` makes one; by default the text
    of an integer array)."""
    if dialect(conn) != "postgres":
        if rows:  # most flushes have no rows of some kinds: nothing to look the statement up for
            conn.executemany(each, rows)
        return
    rows = list(rows)
    if rows:
        conn.execute(at_once, [(column or _integer_array)(values)
                               for values in zip(*rows, strict=True)])


def _integer_array(values: Iterable[int]) -> str:
    """PostgreSQL's text of an array of integers: made in C, where psycopg adapts a list
    value by value in Python (about 1 us a link)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


# PostgreSQL: a batch's identity links in one statement (parsed and planned once).
_INSERT_IDENTITIES = native(
    "postgres", "INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
                " SELECT * FROM unnest(?::bigint[], ?::text[], ?::bigint[], ?::bigint[])"
                " ON CONFLICT DO NOTHING")


def link_identities(conn: sqlite3.Connection, rows: Iterable[Sequence]) -> None:
    """(site id, uid, visitor id, linked at) each, from `$identify` events."""
    _write_rows(conn, _INSERT_IDENTITY, _INSERT_IDENTITIES, rows, column=list)
