"""ingest/: the bounded queue, the flush thread's retries and final flush, and the drain of
a real gunicorn on SIGTERM."""

from __future__ import annotations

import sqlite3
import threading
import weakref

import orjson
import pytest

import ingest.flusher as flusher_module
from app import create_app
from enrichment.enricher import Enricher
from ingest.flusher import Flusher
from ingest.pipeline import BatchWriter, write_batch
from ingest.queue import Accepted, EventQueue
from quota.usage import QuotaGuard
from tests.conftest import (
    WAIT,
    FakeClock,
    WriteLock,
    bearer,
    config_for,
    counting_bytes,
    execute,
    http,
    is_postgres,
    provision,
    rows,
    wait_until,
)
from validation.event import parse_events

NOW_MS = 1_790_000_000_000
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def unit(count: int, name: str = "e", site_id: int = 1, account_id: int = 1,
         counted: int | None = None) -> Accepted:
    body = {"s": "site", "e": name, "u": "https://example.com/", "ip": "81.2.69.142", "ua": FIREFOX}
    _, events = parse_events(body, NOW_MS)
    return Accepted(site_id, account_id, "2026-09", NOW_MS // 86_400_000, events * count,
                    count if counted is None else counted)


# The queue -----------------------------------------------------------------------------


def test_offer_is_all_or_nothing_and_counts_what_is_being_stored():
    queue = EventQueue(100)
    assert queue.offer(unit(50)) and queue.offer(unit(40))
    assert not queue.offer(unit(11))
    assert queue.held == 90 and queue.waiting == 90
    taken = queue.take()
    assert [len(u.events) for u in taken] == [50, 40]
    assert queue.waiting == 0 and queue.held == 90  # taken but not stored: still held
    assert not queue.offer(unit(11))
    assert queue.offer(unit(10))
    queue.stored(taken)
    assert queue.held == 10 and queue.offer(unit(90))
    queue.close()
    assert not queue.offer(unit(1))


def test_offer_wakes_the_flush_thread_at_a_quarter_of_the_queue():
    queue = EventQueue(200)
    woke = threading.Event()

    def waiter():
        queue.wait(60)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    queue.offer(unit(49))
    assert not woke.wait(0.05)
    queue.offer(unit(1))
    assert woke.wait(WAIT)
    thread.join()


# The flush thread --------------------------------------------------------------------


def make_flusher(db, write=None, interval=3600.0, quota=None, queue_max=10_000):
    clock = FakeClock(NOW_MS / 1000)
    return Flusher(db, EventQueue(queue_max), Enricher(db, clock, counting_bytes()),
                   interval=interval, quota=quota, write=write, busy_timeout_ms=20,
                   backoff=(0.01, 0.05))


def count(db_path: str, sql: str = "SELECT count(*) FROM events") -> int:
    first = rows(db_path, sql)[0]
    return next(iter(first.values())) or 0


def test_stop_flushes_everything_held(store, db_path):
    flusher = make_flusher(store)  # an hour between flushes: only stop() can store these
    flusher.start()
    for i in range(30):
        assert flusher.submit(unit(10, name=f"u{i}"))
    flusher.stop(timeout=20)
    assert count(db_path) == 300
    assert count(db_path, "SELECT events FROM monthly_usage") == 300
    assert not flusher.submit(unit(1))  # closed


class TrackedEvents(list):
    """A unit's events that a weak reference can follow (a plain list cannot be)."""


def test_the_flush_thread_lets_go_of_the_events_it_stored(store, db_path):
    flusher = make_flusher(store, queue_max=100)  # parts of 25 events on SQLite
    flusher.start()
    units = [unit(20, name=f"u{i}") for i in range(4)]
    units = [u._replace(events=TrackedEvents(u.events)) for u in units]
    tracked = [weakref.ref(u.events) for u in units]
    for u in units:
        assert flusher.submit(u)
    del units, u
    assert flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 80
    # The thread now waits for the next flush: nothing it stored is still held.
    assert [events() for events in tracked] == [None] * 4
    flusher.stop(timeout=5)


def test_write_runs_in_one_transaction_and_failures_keep_the_batch(store, db_path):
    calls = []

    def flaky_write(conn, batch):
        calls.append(len(batch.rows))
        assert conn.in_transaction
        write_batch(conn, batch)  # half done, then the disk fails: must roll back
        if len(calls) <= 3:
            raise sqlite3.OperationalError("disk I/O error")

    guard = QuotaGuard(store, FakeClock(NOW_MS / 1000))
    flusher = make_flusher(store, write=flaky_write, quota=guard)
    guard.hold((1, "2026-09"), 25)
    assert flusher.submit(unit(25))
    assert flusher.flush_now(timeout=WAIT)
    assert calls == [25, 25, 25, 25] and flusher.failures == 3
    assert count(db_path) == 25  # stored once: the failed attempts rolled back
    assert count(db_path, "SELECT events FROM monthly_usage") == 25
    assert guard.used((1, "2026-09")) == 25  # moved from "held" to "stored", not both
    flusher.stop(timeout=5)


def test_the_flush_decides_before_the_write_lock_on_sqlite_and_under_it_on_postgres(
        store, db_path):
    class Watched(BatchWriter):
        def prepare(self, conn, batch):
            seen.append(("prepare", conn.in_transaction))
            return super().prepare(conn, batch)

        def __call__(self, conn, batch, prepared=None):
            seen.append(("write", prepared is not None))
            super().__call__(conn, batch, prepared)

    seen = []
    flusher = make_flusher(store, write=Watched())
    assert flusher.submit(unit(5))
    assert flusher.flush_now(timeout=WAIT)
    flusher.stop(timeout=5)
    if store.dialect == "sqlite":
        assert seen == [("prepare", False), ("write", True)]
    else:
        assert seen == [("write", False)]
    assert count(db_path) == 5
    assert count(db_path, "SELECT count(*) FROM sessions") >= 1


def visit(minute: int, visitor: int = 1, name: str = "pageview", **fields) -> Accepted:
    """An event `minute` minutes before NOW_MS, of visitor number `visitor` (its address)."""
    body = {"s": "site", "e": name, "u": f"https://example.com/{minute}", "ua": FIREFOX,
            "ip": f"81.2.69.{visitor}", "ts": NOW_MS - (60 - minute) * 60_000, **fields}
    _, events = parse_events(body, NOW_MS)
    return Accepted(1, 1, "2026-09", NOW_MS // 86_400_000, events,
                    0 if name == "$identify" else 1)


def stored_sessions(db_path: str) -> list[tuple]:
    return [tuple(row.values()) for row in rows(
        db_path, "SELECT s.started_at, s.last_seen_at, s.pageviews, s.custom_events,"
        " (SELECT count(*) FROM session_links v WHERE v.session_id = s.id) AS links,"
        " (SELECT count(*) FROM events e WHERE e.session_id = s.id) AS events"
        " FROM sessions s ORDER BY s.started_at, s.last_seen_at DESC")]


def prepared_statements(flusher) -> int:
    """The statements the flush thread's PostgreSQL connection holds prepared (the thread
    is waiting for its next flush: the test may use its connection)."""
    return flusher._conn.raw.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]


def test_sessions_continue_across_flushes_and_a_restart_on_a_connection_that_prepares(
        store, db_path):
    """Each flush runs the same statements (PostgreSQL prepares them from their second
    run, and sends the sessions' changes, links and usage in one pipeline): flush after
    flush, and after a new flush thread on the data written, sessions continue exactly."""
    flusher = make_flusher(store)
    for minute in range(0, 10, 2):  # five flushes: a session continued, a visitor new
        assert flusher.submit(visit(minute))
        assert flusher.submit(visit(minute + 1, visitor=10 + minute, name="signup"))
        assert flusher.submit(visit(minute + 1, name="$identify", uid=f"user-{minute}"))
        assert flusher.flush_now(timeout=WAIT)
    if store.dialect == "postgres":
        from storage.postgres import PREPARE_THRESHOLD

        assert flusher._conn.raw.prepare_threshold == PREPARE_THRESHOLD
        assert not flusher._conn.out_of_step
        assert prepared_statements(flusher) >= 5  # the flush's own (BEGIN and the locks never)
    flusher.stop(timeout=5)
    restarted = make_flusher(store)  # a new flush thread and connection, as after a restart
    assert restarted.submit(visit(12))
    assert restarted.submit(visit(13, visitor=10))
    assert restarted.flush_now(timeout=WAIT)
    restarted.stop(timeout=5)
    minute = 60_000
    start = NOW_MS - 60 * minute
    assert stored_sessions(db_path) == [
        (start, start + 12 * minute, 6, 0, 1, 6),  # visitor 1, continued by every flush
        (start + 1 * minute, start + 13 * minute, 1, 1, 1, 2),  # visitor 10, and after the restart
        (start + 3 * minute, start + 3 * minute, 0, 1, 1, 1),
        (start + 5 * minute, start + 5 * minute, 0, 1, 1, 1),
        (start + 7 * minute, start + 7 * minute, 0, 1, 1, 1),
        (start + 9 * minute, start + 9 * minute, 0, 1, 1, 1)]
    assert count(db_path, "SELECT count(*) FROM visitor_identities") == 5
    assert count(db_path) == 17
    assert count(db_path, "SELECT events FROM monthly_usage") == 12


def test_a_flush_that_fails_part_way_is_stored_whole_on_its_retry(store, db_path):
    """A flush held up by another writer (on PostgreSQL a stored session's row locked, so
    the pipelined UPDATE of the sessions it continues fails after the lock timeout and the
    server skips the rest of the pipeline, PREPAREs among them) is retried until it is
    stored whole, and the flushes after it run the same statements again."""
    flusher = make_flusher(store)
    for minute in (0, 1):  # each statement's first two runs; PostgreSQL prepares the third
        assert flusher.submit(visit(minute))
        assert flusher.submit(visit(minute, visitor=2, name="$identify", uid=f"u-{minute}"))
        assert flusher.submit(visit(minute, visitor=10 + minute))
        assert flusher.flush_now(timeout=WAIT)
    if store.dialect == "postgres":
        from storage.postgres import PostgresDatabase

        holder = PostgresDatabase(db_path).connect()
        holder.execute("BEGIN")
        holder.execute("SELECT id FROM sessions FOR UPDATE").fetchall()
        release = holder.close  # ends the transaction and its row locks
    else:
        release = WriteLock(db_path).release
    try:
        # Visitor 1's session continued, a new visitor linked, a user identified.
        assert flusher.submit(visit(2))
        assert flusher.submit(visit(3, visitor=3))
        assert flusher.submit(visit(3, visitor=2, name="$identify", uid="user-2"))
        flusher.queue.wake()  # the flush, not waited for: it fails while the lock is held
        assert wait_until(lambda: flusher.failures >= 2)
    finally:
        release()
    assert flusher.flush_now(timeout=WAIT)
    assert flusher.submit(visit(4))  # and the statements run again after it
    assert flusher.submit(visit(5, visitor=4))
    assert flusher.flush_now(timeout=WAIT)
    flusher.stop(timeout=5)
    assert flusher.set_aside_events == 0
    minute = 60_000
    start = NOW_MS - 60 * minute
    assert stored_sessions(db_path) == [
        (start, start + 4 * minute, 4, 0, 1, 4),
        (start, start, 1, 0, 1, 1),
        (start + 1 * minute, start + 1 * minute, 1, 0, 1, 1),
        (start + 3 * minute, start + 3 * minute, 1, 0, 1, 1),
        (start + 5 * minute, start + 5 * minute, 1, 0, 1, 1)]
    assert count(db_path) == 11
    assert count(db_path, "SELECT count(*) FROM visitor_identities") == 3
    assert count(db_path, "SELECT events FROM monthly_usage") == 8


def test_the_flush_has_its_tables_analyzed_and_plans_again_as_they_grow(
        store, db_path, monkeypatch):
    """The flush's statements and triggers are planned by their first runs on its
    connection, here while customers is empty and without statistics (as on a server
    without autovacuum), where site_id looks like a row's key: a plan may join the site's
    customers to a batch's visitors, or look an identity's customers up, on site_id alone.
    Once the events the flush stored have doubled past REPLAN_FIRST it has the tables it
    reads analyzed, and with 3,000 customers a batch's visitors and identities are looked
    up by their own keys, not against every customer of the site."""
    if store.dialect != "postgres":
        pytest.skip("SQLite plans each statement when it is prepared, on the data it holds")
    monkeypatch.setattr(flusher_module, "REPLAN_FIRST", 4)
    flusher = make_flusher(store)
    visitors = iter(range(2, 250))

    def flush_new_visitors():
        for _ in range(2):
            visitor = next(visitors)
            assert flusher.submit(visit(0, visitor=visitor))
            assert flusher.submit(visit(0, visitor=visitor, name="$identify", uid=f"u-{visitor}"))
        assert flusher.flush_now(timeout=WAIT)

    def site_wide_reads() -> int:
        # The flush's backend reports its counts when it next goes idle (now, forced).
        flusher._conn.raw.execute("SELECT pg_stat_force_next_flush()")
        counts = {row["indexrelname"]: row for row in rows(
            db_path, "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes"
                     " WHERE schemaname = current_schema()")}
        # An identity probed for each customer, and customers read through an index.
        return (counts["visitor_identities_pkey"]["idx_scan"]
                + counts["customers_user"]["idx_tup_read"]
                + counts["customers_visitor"]["idx_tup_read"])

    try:
        for _ in range(8):  # 32 events: plans made on empty tables, the next re-plan due
            flush_new_visitors()
        execute(db_path, "INSERT INTO customers (site_id, customer_id, user_id, visitor_id,"
                         " as_of_ms, created_at, updated_at) SELECT 1, 'cus_' || g, 'user_' || g,"
                         " 'v' || g, 0, 0, 0 FROM generate_series(1, 3000) AS g")
        flush_new_visitors()
        before = site_wide_reads()
        for _ in range(6):
            flush_new_visitors()
        assert site_wide_reads() - before < 3000
        assert rows(db_path, "SELECT last_analyze FROM pg_stat_user_tables"
                             " WHERE schemaname = current_schema()"
                             " AND relname = 'customers'")[0]["last_analyze"] is not None
    finally:
        flusher.stop(timeout=5)
    assert count(db_path) == 60


def test_a_failed_analyze_never_holds_up_the_flush(store, db_path, monkeypatch):
    """Statistics only help the plans: an ANALYZE the server cancels (a statement_timeout
    of the role, say) is logged, and the batch is stored as it would have been."""
    if store.dialect != "postgres":
        pytest.skip("the flush analyzes only on PostgreSQL")
    import psycopg

    from storage.postgres import PostgresConnection

    def cancelled(conn, tables):
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    monkeypatch.setattr(flusher_module, "REPLAN_FIRST", 1)
    monkeypatch.setattr(PostgresConnection, "analyze", cancelled)
    flusher = make_flusher(store)
    for minute in range(3):
        assert flusher.submit(visit(minute))
        assert flusher.flush_now(timeout=WAIT)
    flusher.stop(timeout=5)
    assert flusher.failures == 0 and flusher.set_aside_events == 0
    assert count(db_path) == 3


def test_the_flush_prepares_nothing_when_prepared_statements_are_off(store, db_path):
    if store.dialect != "postgres":
        pytest.skip("sqlite3 keeps every connection's statements prepared")
    from storage.backend import open_database

    unprepared = open_database(config_for(db_path, database_prepared=False))
    try:
        flusher = make_flusher(unprepared)
        for minute in range(3):
            assert flusher.submit(visit(minute))
            assert flusher.flush_now(timeout=WAIT)
        assert flusher._conn.raw.prepare_threshold is None
        assert prepared_statements(flusher) == 0
        flusher.stop(timeout=5)
    finally:
        unprepared.close()
    assert stored_sessions(db_path)[0][2] == 3


def test_the_quota_check_never_waits_for_a_commit(store, db_path, monkeypatch):
    """While this worker's flush commits, the check answers from the count it read
    before plus what the worker holds, without reading or waiting for the commit."""
    clock = FakeClock(NOW_MS / 1000)
    guard = QuotaGuard(store, clock, ttl=1.0)
    key = (1, "2026-09")
    flusher = make_flusher(store, quota=guard)
    guard.hold(key, 30)
    assert flusher.submit(unit(30))
    assert flusher.flush_now(timeout=WAIT)
    assert guard.usage(key) == (30, 0)
    guard.hold(key, 7)
    clock.advance(5)  # the count read is out of date
    guard.begin_commit()  # the flush of the 7 held events is committing

    def no_read():
        raise AssertionError("the quota check read the database during a commit")

    monkeypatch.setattr(store, "conn", no_read)
    answers = []
    checker = threading.Thread(target=lambda: answers.append(guard.usage(key)))
    checker.start()
    checker.join(WAIT)
    assert answers == [(37, 0)]  # answered while the commit is still open
    guard.end_commit(stored={key: 7}, totals={key: 37})
    assert guard.usage(key) == (37, 0)
    monkeypatch.undo()
    flusher.stop(timeout=5)
    # A new worker on the same data reads the stored count (the 7 were only held here).
    assert QuotaGuard(store, FakeClock(NOW_MS / 1000)).used(key) == 30


def test_a_first_quota_read_during_a_commit_is_used_once(store):
    clock = FakeClock(NOW_MS / 1000)
    guard = QuotaGuard(store, clock)
    key = (1, "2026-09")
    guard.begin_commit()
    assert guard.used(key) == 0
    assert guard._shared[key][0] <= clock()  # read again on the next check
    guard.end_commit(totals={key: 4})
    assert guard.used(key) == 4


def test_a_full_disk_stores_a_batch_in_the_largest_parts_that_fit(store, db_path, caplog):
    calls = []

    def write_what_fits(conn, batch):
        calls.append(len(batch.rows))
        write_batch(conn, batch)
        if len(batch.rows) > 10:  # the space left holds ten events a transaction
            raise sqlite3.OperationalError("database or disk is full")

    guard = QuotaGuard(store, FakeClock(NOW_MS / 1000))
    flusher = make_flusher(store, write=write_what_fits, quota=guard)
    guard.hold((1, "2026-09"), 25)
    assert flusher.submit(unit(25))
    assert flusher.flush_now(timeout=30)
    # Halves until one fits, then everything left in one go again.
    assert calls == [25, 12, 6, 19, 6, 13, 6, 7]
    assert count(db_path) == 25 and flusher.set_aside_events == 0
    assert count(db_path, "SELECT events FROM monthly_usage") == 25
    assert guard.used((1, "2026-09")) == 25
    assert "disk full: stored 25 events in smaller transactions (4 splits)" in caplog.text
    flusher.stop(timeout=5)


def test_unexpected_error_in_enrichment_is_retried(store, db_path, monkeypatch):
    flusher = make_flusher(store)
    original = flusher.enricher.build
    failures = iter([RuntimeError("boom")])

    def build(conn, units):
        for failure in failures:
            raise failure
        return original(conn, units)

    monkeypatch.setattr(flusher.enricher, "build", build)
    assert flusher.submit(unit(3))
    assert flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 3 and flusher.failures == 1
    flusher.stop(timeout=5)


def test_stop_gives_up_only_at_its_deadline_when_the_database_stays_locked(store, db_path, caplog):
    flusher = make_flusher(store)
    assert flusher.flush_now(timeout=WAIT)  # the thread is up (a slow start is not the test)
    assert flusher.submit(unit(5))
    blocker = WriteLock(db_path)
    try:
        flusher.stop(timeout=1)
        flusher._thread.join(WAIT)  # a busy machine may end it after stop() has returned
    finally:
        blocker.release()
    assert flusher.failures >= 1
    assert "5 accepted events could not be stored" in caplog.text
    assert count(db_path) == 0


def test_building_the_app_starts_no_thread(db_path):
    before = {t.name for t in threading.enumerate()}
    app = create_app(config_for(db_path))
    assert "tally-flush" not in {t.name for t in threading.enumerate()} - before
    app.stop(timeout=1)


def test_first_submit_starts_the_thread_when_start_was_never_called(store, db_path):
    flusher = make_flusher(store)
    assert flusher._thread is None
    assert flusher.submit(unit(2))
    assert flusher._thread is not None and flusher._thread.is_alive()
    assert flusher.flush_now(timeout=WAIT) and count(db_path) == 2
    flusher.stop(timeout=5)


# A real gunicorn: SIGTERM drains every acknowledged event -------------------------------


def setup_site(db_path: str, plan: str = "scale") -> tuple[str, str, str]:
    account, site, key = provision(db_path, name="Drain", plan=plan, host="example.com")
    return account["id"], site["id"], key["key"]


@pytest.mark.slow
def test_sigterm_drains_every_acknowledged_event(db_path, server_factory):
    _, site_id, key = setup_site(db_path)
    # An hour between flushes and a large queue: nothing is stored before the SIGTERM.
    server = server_factory(db_path, workers=2,
                            env={"TALLY_FLUSH_INTERVAL": "3600", "TALLY_QUEUE_MAX": "100000"})
    headers = {**bearer(key), "Content-Type": "application/json"}
    acknowledged = 0
    for i in range(30):
        body = {"s": site_id, "b": [{"e": f"b{i}", "u": f"https://example.com/{j}",
                                     "ip": f"203.0.113.{j}", "ua": FIREFOX} for j in range(50)]}
        status, _, _ = http("POST", server.url + "/api/v1/events", orjson.dumps(body), headers)
        assert status == 204
        acknowledged += 50
    for _ in range(20):
        body = {"s": site_id, "e": "single", "u": "https://example.com/", "ua": FIREFOX}
        status, _, _ = http("POST", server.url + "/api/v1/events", orjson.dumps(body), headers)
        assert status == 204
        acknowledged += 1
    assert count(db_path) == 0  # all of it is still in the workers' memory

    assert server.stop() == 0
    assert count(db_path) == acknowledged == 1520
    assert count(db_path, "SELECT events FROM monthly_usage") == 1520
    assert count(db_path, "SELECT count(DISTINCT name) FROM events") == 31
    assert "could not be stored" not in server.log()


def test_a_flush_writes_at_most_a_quarter_of_the_queue_a_transaction(store, db_path):
    transactions = []

    def counting_write(conn, batch):
        transactions.append(len(batch.rows))
        write_batch(conn, batch)

    guard = QuotaGuard(store, FakeClock(NOW_MS / 1000))
    flusher = make_flusher(store, write=counting_write, quota=guard, queue_max=200)
    for _ in range(7):
        guard.hold((1, "2026-09"), 25)
        assert flusher.submit(unit(25))
    assert flusher.flush_now(timeout=WAIT)
    if is_postgres(db_path):
        assert transactions == [175]  # PostgreSQL: everything taken in one transaction
    else:
        assert transactions == [50, 50, 50, 25]  # whole units, in order, at most 200 / 4 each
    assert count(db_path) == 175
    assert guard.used((1, "2026-09")) == 175
    flusher.stop(timeout=5)
    assert QuotaGuard(store, FakeClock(NOW_MS / 1000)).used((1, "2026-09")) == 175
