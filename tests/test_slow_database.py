"""A slow or busy database never turns a valid key away: the key lookup waits the bounded
time and then answers 503 `rate_limited` (retry), never 401 (which would tell the client
its key is bad) nor 500. On both backends: another connection holds the tables the lookup
reads (PostgreSQL: a table lock; SQLite: the file in exclusive locking mode), and on
PostgreSQL the pool has no connection free."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager

import orjson
import pytest
import webtest

from app import create_app
from tests.conftest import bearer, config_for, connect, is_postgres, rows, wait_until

BUSY_MS = 300  # the bounded wait, short so the test is quick; the default is 5 s


@contextmanager
def busy_world(db: str, clock):
    tally = create_app(config_for(db, busy_timeout_ms=BUSY_MS, database_pool=1), clock=clock)
    account = tally.directory.create_account("Busy", "free")
    site = tally.directory.create_site(account["id"], ["example.com"])
    key = tally.directory.create_key(site["id"], ["events", "read"])
    try:
        yield {"tally": tally, "client": webtest.TestApp(tally), "site": site["id"],
               "key": key["key"], "key_id": key["id"], "clock": clock, "db": db}
    finally:
        tally.stop(timeout=5)


@pytest.fixture
def world(db_path, clock):
    with busy_world(db_path, clock) as world:
        yield world


@pytest.fixture
def postgres_world(postgres_schema, clock):
    """PostgreSQL only: SQLite's WAL readers never wait for another connection's write,
    and every SQLite thread has a connection of its own (no pool)."""
    with busy_world(postgres_schema, clock) as world:
        yield world


@contextmanager
def tables_held(db: str):
    """Another connection holds what the key and site lookups read, until the block ends."""
    if is_postgres(db):
        conn = connect(db)
        conn.execute("BEGIN")
        conn.execute("LOCK TABLE api_keys, sites, accounts IN ACCESS EXCLUSIVE MODE")
    else:
        # WAL readers never wait for a writer; a file held in exclusive locking mode is the
        # one thing a new connection (a worker thread's first request) must wait for.
        conn = sqlite3.connect(db, isolation_level=None, timeout=0)
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("UPDATE accounts SET name = name")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def key_request(world) -> webtest.TestResponse:
    return world["client"].get("/api/v1/key", headers=bearer(world["key"]), expect_errors=True)


def collect_request(world) -> webtest.TestResponse:
    event = {"s": world["site"], "e": "pageview", "u": "https://example.com/"}
    return world["client"].post("/api/v1/collect", orjson.dumps(event), expect_errors=True,
                                headers={"Content-Type": "text/plain",
                                         "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0"})


def assert_busy(resp) -> None:
    assert resp.status_int == 503, resp.body
    assert resp.json == {"ok": False, "error": {
        "code": "rate_limited", "message": "the database is busy; retry after 2 seconds"}}
    assert resp.headers["Retry-After"] == "2"


def forget_lookups(world) -> None:
    """Past the caches' TTL, and (SQLite) without this thread's connection, as a worker
    thread's first request would be."""
    world["clock"].advance(60)
    world["tally"].db.close()


def test_a_valid_key_is_answered_503_while_the_database_is_busy_never_401(world):
    assert key_request(world).status_int == 200
    forget_lookups(world)
    with tables_held(world["db"]):
        assert_busy(key_request(world))
        assert_busy(world["client"].get("/api/v1/stats/aggregate", headers=bearer(world["key"]),
                                        expect_errors=True))
        assert_busy(collect_request(world))  # the site lookup: 503, not 404 "no such site"
    resp = key_request(world)
    assert resp.status_int == 200 and resp.json["data"]["id"] == world["key_id"]
    assert collect_request(world).status_int == 204


def test_a_key_lookup_that_waits_within_the_bound_is_answered(postgres_world):
    world, db_path = postgres_world, postgres_world["db"]
    forget_lookups(world)
    answers = []
    with tables_held(db_path):
        world["tally"].db.busy_timeout_ms = 120_000  # a slow database, not a stuck one
        request = threading.Thread(target=lambda: answers.append(key_request(world)))
        request.start()
        assert wait_until(lambda: rows(db_path, "SELECT count(*) AS n FROM pg_locks l"
                                       " JOIN pg_class c ON c.oid = l.relation"
                                       " WHERE NOT l.granted AND c.relname = 'api_keys'")[0]["n"] > 0)
    request.join(timeout=120)
    assert [a.status_int for a in answers] == [200]


def test_no_free_pool_connection_is_503_never_401(postgres_world):
    world = postgres_world
    forget_lookups(world)
    taken, done = threading.Event(), threading.Event()

    def hold_the_only_connection():
        world["tally"].db.conn()
        taken.set()
        done.wait(60)
        world["tally"].db.release()

    holder = threading.Thread(target=hold_the_only_connection)
    holder.start()
    try:
        assert taken.wait(60)
        assert_busy(key_request(world))
        assert_busy(collect_request(world))
    finally:
        done.set()
        holder.join(timeout=60)
    assert key_request(world).status_int == 200
