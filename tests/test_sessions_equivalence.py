"""The set-based session step decides exactly what the per-visitor one did, and the
whole flush write stores exactly what it stored.

attribution.sessions.SessionWriter loads a batch's sessions with one query and writes
with executemany; tests/sessions_reference.py is the writer it replaced, which looked
each visitor up in the database in turn. The reference runs on a real SQLite file and
the set-based writer on the backend under test (a SQLite file or a PostgreSQL schema),
with the same sites and customers, batch after batch of hits drawn around a midnight UTC
(so visits cross it under two visitor ids), with 30-minute gaps hit exactly, late
earlier events, $identify links and a second site. After every batch the session ids
returned and every table the step writes (sessions, session_visitors,
visitor_identities, and the trigger-kept customer_first_touch and first_touch_refresh)
must be identical. The reference side also keeps the session_visitors trigger as it was
before its WHEN guard (schema version 8), as PostgreSQL's schema has it.

The flush-level test runs accepted units through Enricher.build and the flush's
BatchWriter (decided before the write lock on SQLite) against the reference write
(per-visitor writer, yesterday's id hashed for every event, one executemany of full
rows): receipts around midnight, client `ts` anywhere the endpoint
accepts, two workers flushing in turn (so earlier events arrive late).
"""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attribution.sessions import Hit, SessionWriter, hosts_of_site
from enrichment.enricher import Enricher
from enrichment.urls import campaign, pathname, url_host
from enrichment.visitor import utc_day
from ingest.pipeline import BatchWriter
from ingest.queue import Accepted
from storage.backend import open_database
from storage.db import Database, schema
from storage.dialect import dialect
from storage.sessions import PROVISIONAL_SESSION_ID
from storage.statements import postgres_spelling
from tests.conftest import FakeClock, config_for, counting_bytes
from tests.sessions_reference import ReferenceSessionWriter, reference_write_batch
from validation.event import IDENTIFY, parse_events
from vocabulary import CLICK_IDS

MIDNIGHT = int(datetime(2026, 9, 22, tzinfo=UTC).timestamp() * 1000)
MIN = 60_000
SITES = {1: "example.com", 2: "other.example"}
URLS = ("https://example.com/", "https://example.com/pricing",
        "https://example.com/l?utm_source=newsletter&utm_medium=email",
        "https://example.com/ad?gclid=abc", "https://example.com/p?utm_medium=cpc&fbclid=x")
REFERRERS = (None, "https://www.google.co.uk/", "https://t.co/x", "https://example.com/a",
             "https://chatgpt.com/", "")
# (site, customer id, user id, visitor id): linked by uid, directly, both, or not at all.
CUSTOMERS = ((1, "cus_u1", "u1", None), (1, "cus_v11", None, "11"), (1, "cus_both", "u2", "-32"),
             (1, "cus_v12", None, "12"), (1, "cus_none", None, None), (2, "cus_s2", "u1", "21"))
# first_touch_new_session_visitor before schema version 8: no WHEN, the body for every row.
UNGUARDED_TRIGGER = """
CREATE TRIGGER first_touch_new_session_visitor AFTER INSERT ON session_visitors
BEGIN
    INSERT INTO first_touch_refresh (site_id, customer_id)
    SELECT site_id, customer_id FROM customers
     WHERE site_id = NEW.site_id AND visitor_id = CAST(NEW.visitor_id AS TEXT)
    UNION
    SELECT c.site_id, c.customer_id
      FROM visitor_identities vi CROSS JOIN customers c
     WHERE vi.site_id = NEW.site_id AND vi.visitor_id = NEW.visitor_id
       AND c.site_id = vi.site_id AND c.user_id = vi.uid;
END"""
TABLES = {
    "sessions": "SELECT * FROM sessions ORDER BY id",
    "session_visitors": "SELECT * FROM session_visitors ORDER BY session_id, visitor_id",
    "visitor_identities": "SELECT * FROM visitor_identities ORDER BY site_id, uid, visitor_id",
    "customer_first_touch": "SELECT * FROM customer_first_touch ORDER BY site_id, customer_id",
    "first_touch_refresh": "SELECT * FROM first_touch_refresh ORDER BY site_id, customer_id",
}


def visitor(person: int, day: int) -> int:
    """Person 1-3's visitor id on day 0 (before midnight) or 1; person 3's are negative."""
    return (-1 if person == 3 else 1) * (person * 10 + day + 1)


def make_hit(site_id, ts, person, day, previous, name, url, referrer, uid) -> Hit:
    found = campaign(url)
    clicks = tuple(key for key, value in zip(CLICK_IDS, found[5:], strict=True) if value)
    visitor_id = None if person is None else visitor(person, day)
    previous_id = None if person is None or not previous else visitor(person, day - 1)
    return Hit(site_id, visitor_id, ts, name, url, pathname(url, url.index("/", 8)), referrer,
               url_host(referrer), found[:5], clicks, uid, previous_id)


hits = st.builds(
    make_hit,
    site_id=st.sampled_from((1, 1, 1, 2)),
    ts=st.integers(-100, 100).map(lambda m: MIDNIGHT + m * MIN)
    | st.integers(-100 * MIN, 100 * MIN).map(lambda ms: MIDNIGHT + ms),
    person=st.sampled_from((1, 2, 3, None)),
    day=st.sampled_from((0, 1)),
    previous=st.booleans(),
    name=st.sampled_from(("pageview", "pageview", "signup", "$identify")),
    url=st.sampled_from(URLS),
    referrer=st.sampled_from(REFERRERS),
    uid=st.sampled_from((None, "u1", "u2", "u3")),
)


def seed_sites(conn, *, reference: bool) -> None:
    """The sites and customers both sides start from; the reference's old trigger."""
    if reference:
        conn.execute("DROP TRIGGER first_touch_new_session_visitor")
        conn.execute(UNGUARDED_TRIGGER)
    conn.execute("INSERT INTO accounts (id, public_id, name, created_at)"
                 " VALUES (1, 'acct_a', 'A', 0)")
    for site_id, host in SITES.items():
        conn.execute("INSERT INTO sites (id, public_id, account_id, created_at)"
                     " VALUES (?, ?, 1, 0)", (site_id, f"site_{site_id}"))
        conn.execute("INSERT INTO site_hosts (site_id, host) VALUES (?, ?)", (site_id, host))
    conn.executemany(
        "INSERT INTO customers (site_id, customer_id, user_id, visitor_id, as_of_ms,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0, 0)", CUSTOMERS)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, module_database):
    """Seeded connections made once for the module: "reference" (SQLite), and the
    set-based side's on "sqlite" or "postgres", made when a test first asks."""
    made = {}

    def connection(name: str):
        if name not in made:
            if name == "reference":
                db = Database(str(tmp_path_factory.mktemp("reference") / "tally.db"))
            else:
                db = open_database(config_for(module_database(name)))
            made[name] = db.connect()
            seed_sites(made[name], reference=name == "reference")
        return made[name]

    yield connection
    for conn in made.values():
        conn.close()


@pytest.fixture
def pair(seeded, backend):
    """(connection, writer): the reference on SQLite, the set-based one on `backend`."""
    return [(seeded("reference"), ReferenceSessionWriter(hosts_of_site)),
            (seeded(backend), SessionWriter())]


RESTART_SESSION_IDS = postgres_spelling(
    "SELECT setval(pg_get_serial_sequence('sessions', 'id'), coalesce(max(id), 0) + 1, false)"
    " FROM sessions")


def tables(conn) -> dict[str, list[tuple]]:
    return {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}


def assert_same(pair, batches: list[list[Hit]]) -> None:
    """Each side records the batches in one transaction, rolled back afterwards."""
    for conn, _ in pair:
        conn.execute("BEGIN IMMEDIATE")
        if dialect(conn) == "postgres":
            # PostgreSQL's new sessions draw ids from a sequence, which a rollback does not
            # take back: each example starts it where the reference's ids start.
            conn.execute(RESTART_SESSION_IDS)
    try:
        for batch in batches:
            (ref_conn, reference), (conn, writer) = pair
            expected = reference.record(ref_conn, batch)
            assert writer.record(conn, batch) == expected
            assert tables(conn) == tables(ref_conn)
    finally:
        for conn, _ in pair:
            conn.execute("ROLLBACK")


# PostgreSQL's side answers every statement over a socket: fewer examples there.
EXAMPLES = {"sqlite": 250, "postgres": 100}


def test_small_batches_around_midnight_match_the_per_visitor_writer(pair, backend):
    @settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES") or EXAMPLES[backend]),
              derandomize=not os.environ.get("FUZZ_EXAMPLES"), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(batches=st.lists(st.lists(hits, min_size=1, max_size=12), min_size=1, max_size=5))
    def check(batches):  # each example rolls its writes back (assert_same)
        assert_same(pair, batches)

    check()


def page(ts: int, person: int = 1, day: int = 1, previous: bool = False, referrer=None) -> Hit:
    return make_hit(1, ts, person, day, previous, "pageview", URLS[0], referrer, None)


T = MIDNIGHT + 10 * MIN
GAP = 30 * MIN
# Edges where a stored session is found, or not, by the batch's one load query.
EDGES = {
    "stored, seen exactly 30 min before": [[page(T)], [page(T + GAP)]],
    "stored, seen 30 min and 1 ms before": [[page(T)], [page(T + GAP + 1)]],
    "stored, starts exactly 30 min after (late event)": [[page(T)], [page(T - GAP, referrer=REFERRERS[1])]],
    "stored, starts 30 min and 1 ms after": [[page(T)], [page(T - GAP - 1)]],
    "reached only once the batch extends it": [[page(T)], [page(T + 25 * MIN), page(T + 50 * MIN)]],
    # Yesterday's and today's ids each have a session last seen at T; a hit carrying both
    # ids continues the one with the greater id.
    "tie on last seen, greater id wins": [[page(T, day=0)], [page(T)], [page(T + MIN, previous=True)]],
    "tie, other order": [[page(T)], [page(T, day=0)], [page(T + MIN, previous=True)]],
    "identify links yesterday's id only while its visit is open": [
        [page(MIDNIGHT - 5 * MIN, day=0)],
        [make_hit(1, MIDNIGHT + 20 * MIN, 1, 1, True, "$identify", URLS[0], None, "u1"),
         make_hit(1, MIDNIGHT + 40 * MIN, 2, 1, True, "$identify", URLS[0], None, "u2")]],
}


@pytest.mark.parametrize("batches", EDGES.values(), ids=EDGES.keys())
def test_edges_of_the_load_window_match_the_per_visitor_writer(pair, batches):
    assert_same(pair, batches)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_large_flushes_match_the_per_visitor_writer(pair, seed):
    """Flush-sized batches: many visitors at once, each seen again across flushes."""
    rnd = random.Random(seed)

    def draw(start_minute: int) -> Hit:
        return make_hit(rnd.choice((1, 1, 1, 2)), MIDNIGHT + (start_minute + rnd.randint(0, 50)) * MIN
                        + rnd.choice((0, 0, 1, -1)), rnd.choice((1, 2, 3, None)), rnd.randint(0, 1),
                        rnd.random() < 0.8, rnd.choice(("pageview", "signup", "$identify")),
                        rnd.choice(URLS), rnd.choice(REFERRERS), rnd.choice((None, "u1", "u2")))

    batches = [[draw(start) for _ in range(300)] for start in range(-90, 90, 20)]
    # Plus a crowd of distinct visitors (most open a session), as a loaded server sees.
    batches.append([make_hit(1, MIDNIGHT + 5 * MIN + n, person, 1, True, "pageview", URLS[0],
                             None, None) for n, person in enumerate(range(4, 124))])
    assert_same(pair, batches)


@pytest.mark.sqlite_only  # a SQLite file's schema upgrade
def test_opening_an_older_database_replaces_the_unguarded_trigger(tmp_path):
    path = str(tmp_path / "old.db")
    conn = Database(path).connect()
    conn.execute("DROP TRIGGER first_touch_new_session_visitor")
    conn.execute(UNGUARDED_TRIGGER)
    conn.execute(f"PRAGMA user_version = {schema()[0] - 1}")  # sql-safe: an int
    conn.close()
    conn = Database(path).connect()  # a new process's first connection applies schema.sql
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'"
                          " AND name = 'first_touch_new_session_visitor'").fetchone()
    conn.close()
    assert "WHEN EXISTS" in sql


PEOPLE = [(f"81.2.69.{n}", ua) for n in range(1, 5)
          for ua in ("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
                     "Mozilla/5.0 (Android 14; Mobile; rv:128.0) Gecko/128.0 Firefox/128.0")]


def accepted_units(rnd: random.Random, site_public_id: str) -> list[Accepted]:
    """Requests received every 0-4 minutes from 100 minutes before midnight to 100 after."""
    units, received = [], MIDNIGHT - 100 * MIN
    while received < MIDNIGHT + 100 * MIN:
        received += rnd.randint(0, 4 * MIN)
        elements = []
        for _ in range(rnd.randint(1, 6)):
            ip, ua = rnd.choice(PEOPLE)
            element = {"e": rnd.choice(("pageview", "pageview", "signup", IDENTIFY)),
                       "u": rnd.choice(URLS), "ip": ip, "ua": ua,
                       "ts": received + rnd.choice((0, 0, -rnd.randint(0, 3_600_000), 60_000,
                                                    rnd.randint(0, 60_000), -3_600_000))}
            if element["e"] == IDENTIFY:
                element["uid"] = rnd.choice(("u1", "u2", "u3"))
            if rnd.random() < 0.3:
                element["r"] = rnd.choice(REFERRERS[1:-1])
            elements.append(element)
        events = parse_events({"s": site_public_id, "b": elements}, received)[1]
        counted = sum(1 for event in events if event.name != IDENTIFY)
        units.append(Accepted(1, 1, "2026-09", utc_day(received), events, counted))
    return units


def flush_sides(db_path, tmp_path) -> list:
    """(db, conn, write, two enrichers) of the reference (SQLite) and of the flush's
    BatchWriter (the test's database), with the same site, customers and salts."""
    sides = []
    for db, write in ((Database(str(tmp_path / "reference.db")), reference_write_batch),
                      (open_database(config_for(db_path)), BatchWriter())):
        conn = db.connect()
        conn.execute("INSERT INTO accounts (id, public_id, name, created_at) VALUES (1, 'a', 'A', 0)")
        conn.execute("INSERT INTO sites (id, public_id, account_id, created_at) VALUES (1, 'site_1', 1, 0)")
        conn.execute("INSERT INTO site_hosts (site_id, host) VALUES (1, 'example.com')")
        conn.executemany(
            "INSERT INTO customers (site_id, customer_id, user_id, visitor_id, as_of_ms,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0, 0)",
            [c for c in CUSTOMERS if c[0] == 1])
        if write is reference_write_batch:
            conn.execute("DROP TRIGGER first_touch_new_session_visitor")
            conn.execute(UNGUARDED_TRIGGER)
        salts = counting_bytes()  # both sides create the same salts in the same order
        clock = FakeClock(MIDNIGHT / 1000)
        sides.append((db, conn, write, [Enricher(db, clock, salts), Enricher(db, clock, salts)]))
    return sides


def assert_same_tables(sides) -> None:
    (_, reference, *_), (_, conn, *_) = sides
    assert tables(conn) == tables(reference)
    assert (conn.execute("SELECT * FROM events ORDER BY id").fetchall()
            == reference.execute("SELECT * FROM events ORDER BY id").fetchall())


def assert_same_flushes(db_path, tmp_path, flushes: list[tuple[int, list[Accepted]]]) -> list:
    """The reference write (on SQLite) and the flush's (on the test's database: on SQLite
    decided before the lock, as the flush thread does) store the (worker, units) flushes
    in turn; the tables must match after each. Returns the set-based side's
    session_links rows (every visitor id of every session)."""
    sides = flush_sides(db_path, tmp_path)
    try:
        for worker, chunk in flushes:
            for db, conn, write, enrichers in sides:
                batch = enrichers[worker].build(conn, chunk)
                if write is reference_write_batch or db.dialect != "sqlite":
                    with db.transaction(conn):
                        write(conn, batch)
                    continue
                prepared = write.prepare(conn, batch)
                with db.transaction(conn):
                    write(conn, batch, prepared)
            assert_same_tables(sides)
        return sides[1][1].execute("SELECT * FROM session_links").fetchall()
    finally:
        for _, conn, *_ in sides:
            conn.close()


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_flushes_around_midnight_store_what_the_per_visitor_flush_stored(db_path, tmp_path,
                                                                          seed):
    rnd = random.Random(seed)
    units = accepted_units(rnd, "site_1")
    workers = [[], []]  # each worker's queue: its share of the requests, in order
    for unit in units:
        workers[rnd.randint(0, 1)].append(unit)
    flushes = []  # (worker, units), the workers flushing in turn, each what it holds
    while any(workers):
        worker = rnd.randint(0, 1)
        take = rnd.randint(1, 8)
        if workers[worker]:
            flushes.append((worker, workers[worker][:take]))
            del workers[worker][:take]
    links = assert_same_flushes(db_path, tmp_path, flushes)
    sessions_with_two_ids = {row[2] for row in links if [r[2] for r in links].count(row[2]) > 1}
    assert sessions_with_two_ids, "no visit crossed midnight: the test tests nothing"


def request(received: int, *events: tuple[int, str, str]) -> Accepted:
    """A request received at `received` (unix ms) of (ts offset, name, ip) events."""
    ua = PEOPLE[0][1]
    elements = [{"e": name, "u": URLS[0], "ip": ip, "ua": ua, "ts": received + offset,
                 **({"uid": "u1"} if name == IDENTIFY else {})}
                for offset, name, ip in events]
    clean = parse_events({"s": "site_1", "b": elements}, received)[1]
    return Accepted(1, 1, "2026-09", utc_day(received), clean, len(clean))


def test_the_latest_event_yesterdays_id_can_still_continue(db_path, tmp_path):
    # Received a millisecond before midnight, stamped the allowed minute ahead (at
    # midnight + 59,999 ms); the next day, received at 00:30, events 30 minutes after that
    # (continues: ts offset 59,999) and 30 minutes and 1 ms after it (does not: 60,000).
    flushes = [
        (0, [request(MIDNIGHT - 1, (60_000, "pageview", "81.2.69.1"),
                     (60_000, "pageview", "81.2.69.2"))]),
        (1, [request(MIDNIGHT + GAP, (59_999, "pageview", "81.2.69.1"),
                     (60_000, "pageview", "81.2.69.2"))]),
    ]
    links = assert_same_flushes(db_path, tmp_path, flushes)
    # The first visitor's visit continued under both ids; the second's did not.
    assert sorted(session for _, _, session in links) == [1, 1, 2, 3]


@pytest.mark.sqlite_only
def test_a_batch_decided_before_the_lock_is_decided_again_when_its_sessions_moved(
        db_path, tmp_path):
    """BatchWriter.prepare decides a flush before BEGIN IMMEDIATE (SQLite; PostgreSQL decides
    under its per-site lock, tests/test_ingest.py); another worker's
    flush stored in between must leave the same tables as the two flushes in the order
    they committed."""
    sides = flush_sides(db_path, tmp_path)
    (ref_db, reference, reference_write, ref_enrichers), (db, conn, _, enrichers) = sides
    writer = BatchWriter()
    other = db.connect()

    def overtaken(units, other_units) -> list:
        """Worker 0 decides `units` before the lock, worker 1 stores `other_units`, then
        worker 0 writes; the reference stores both in that commit order. Returns worker
        0's session ids as decided before the lock."""
        batch = enrichers[0].build(conn, units)
        prepared = writer.prepare(conn, batch)
        assert prepared is not None
        decided = list(prepared.decided.sessions.session_ids)
        other_batch = enrichers[1].build(other, other_units)
        with db.transaction(other):
            writer(other, other_batch)
        with db.transaction(conn):
            writer(conn, batch, prepared)
        for worker_units, worker in ((other_units, 1), (units, 0)):
            ref_batch = ref_enrichers[worker].build(reference, worker_units)
            with ref_db.transaction(reference):
                reference_write(reference, ref_batch)
        return decided

    try:
        # Worker 0 decides a new session for 81.2.69.1 at 00:20, then worker 1 stores its
        # event of 00:10 (a session the first one must continue, and whose landing it is),
        # and a session of another visitor that takes the next session id.
        late = [request(MIDNIGHT + 20 * MIN, (0, "pageview", "81.2.69.1"))]
        early = [request(MIDNIGHT + 10 * MIN, (0, "pageview", "81.2.69.1"),
                         (0, "pageview", "81.2.69.2"))]
        decided = overtaken(late, early)
        assert [s for s in decided if s] == [PROVISIONAL_SESSION_ID]
        assert writer.decided_again == 1
        assert_same_tables(sides)
        assert conn.execute("SELECT count(DISTINCT session_id) FROM events").fetchone()[0] == 2

        # Another visitor's session stored in between moves nothing this batch read: the
        # decision stands, and its new session takes the id after that one.
        third = [request(MIDNIGHT + 40 * MIN, (0, "pageview", "81.2.69.3"))]
        fourth = [request(MIDNIGHT + 41 * MIN, (0, "pageview", "81.2.69.4"))]
        overtaken(third, fourth)
        assert writer.decided_again == 1
        assert_same_tables(sides)
        assert conn.execute("SELECT max(session_id) FROM events").fetchone()[0] == 4
    finally:
        other.close()
        for _, side_conn, *_ in sides:
            side_conn.close()
