"""Issue 26: every read has a bounded cost. A read past its budget (Config.read_budget) is
stopped where it runs (SQLite's progress handler, PostgreSQL's statement_timeout), nothing
it half-counted is kept, its connection serves the next request as before, and the caller
is told how to narrow the report: 422 query_too_expensive, or a page saying so.

Budgets here are 0 (past before the first statement), a FakeClock moved by hand, or 50 ms
against a statement that would run for many minutes: no outcome depends on timing.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import webtest

from app import create_app
from config import Config, ConfigError
from reports.service import too_expensive
from storage.db import ReadBudgetExceeded
from storage.dialect import dialect
from storage.reads import ReadPool, ReadsBusy
from tests import dashboard_seed as seed
from tests.conftest import FakeClock, bearer, config_for, copy_database, rows

# A statement that runs for many minutes on either backend unless it is stopped.
FOREVER = ("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c"
           " WHERE n < 10000000000) SELECT count(*) FROM c")
THOUSAND_DAYS = (
    "INSERT INTO traffic_days (site_id, day, visitors, pageviews, sessions, events, bounces,"
    " duration_ms) WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c"
    " WHERE n < 1000) SELECT 1, n + 100, 0, 0, 0, 0, 0, 0 FROM c"
)
ONE_DAY = ("INSERT INTO traffic_days (site_id, day, visitors, pageviews, sessions, events,"
           " bounces, duration_ms) VALUES (1, 1, 1, 1, 1, 0, 1, 0)")


def statement_timeout(db) -> str | None:
    if dialect(db.conn()) != "postgres":
        return None
    return db.conn().execute("SHOW statement_timeout").fetchone()[0]


def test_a_statement_past_the_budget_is_stopped_where_it_runs(store):
    """The server (PostgreSQL) or the progress handler (SQLite) stops it, not the caller."""
    timeout = statement_timeout(store)
    with pytest.raises(ReadBudgetExceeded) as stopped:
        with store.read_budget(0.05):
            store.conn().execute(FOREVER).fetchone()
    assert stopped.value.seconds == 0.05
    conn = store.conn()
    assert not conn.in_transaction
    assert statement_timeout(store) == timeout
    # No budget is left behind: a statement of many steps runs to its end.
    assert conn.execute(FOREVER.replace("10000000000", "200000")).fetchone()[0] == 200_000


def test_a_write_the_budget_cuts_short_is_rolled_back(store):
    with pytest.raises(ReadBudgetExceeded):
        with store.read_budget(0.05):
            with store.transaction() as conn:
                conn.execute(ONE_DAY)
                conn.execute(FOREVER).fetchone()
    assert store.conn().execute("SELECT count(*) FROM traffic_days").fetchone()[0] == 0
    clock = FakeClock(0)
    with pytest.raises(ReadBudgetExceeded):
        with store.read_budget(10, clock=clock, check_steps=100):
            with store.transaction() as conn:
                conn.execute(ONE_DAY)
                clock.advance(11)  # the deadline passes between two statements
                conn.execute(THOUSAND_DAYS)
    conn = store.conn()
    assert conn.execute("SELECT count(*) FROM traffic_days").fetchone()[0] == 0
    assert not conn.in_transaction
    with store.transaction() as conn:  # the connection writes as before
        conn.execute(ONE_DAY)
    assert store.conn().execute("SELECT count(*) FROM traffic_days").fetchone()[0] == 1


def test_a_write_outside_a_transaction_is_kept_when_a_later_read_is_stopped(store):
    """Reads under a budget may share a transaction of the budget's own (PostgreSQL: its
    statement_timeout is SET LOCAL); a write outside the caller's transactions is still
    committed on its own, as without a budget."""
    with pytest.raises(ReadBudgetExceeded):
        with store.read_budget(0.05):
            conn = store.conn()
            assert conn.execute("SELECT count(*) FROM traffic_days").fetchone()[0] == 0
            conn.execute(ONE_DAY)
            conn.execute(FOREVER).fetchone()
    conn = store.conn()
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM traffic_days").fetchone()[0] == 1


def test_within_a_budget_an_inner_one_changes_nothing(store):
    clock = FakeClock(0)
    with pytest.raises(ReadBudgetExceeded):
        with store.read_budget(10, clock=clock):
            with store.read_budget(1000):
                clock.advance(11)
                store.conn().execute(FOREVER).fetchone()


def test_reads_run_on_threads_of_lower_priority_and_wait_within_their_budget(store):
    """A read that found every read thread taken for its whole budget is not started:
    ReadsBusy (503), not "too expensive"."""
    clock = FakeClock(0)
    pool = ReadPool(store, 1.0, threads=1, nice=10, clock=clock)
    try:
        here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert pool.run(lambda: os.getpriority(
            os.PRIO_PROCESS, threading.get_native_id())) == min(19, here + 10)
        assert pool.run(lambda: store.conn().execute("SELECT 1").fetchone()[0]) == 1
        holding, release = threading.Event(), threading.Event()
        answers = []

        def second() -> None:
            try:
                answers.append(pool.run(lambda: "counted"))
            except ReadsBusy as exc:
                answers.append(exc)

        first = threading.Thread(target=pool.run, args=(
            lambda: holding.set() or release.wait(30),))
        first.start()
        assert holding.wait(30)
        waiting = threading.Thread(target=second)
        waiting.start()
        deadline = time.monotonic() + 30
        while pool._asked < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.advance(1.5)  # its budget passes while the only thread is taken
        release.set()
        first.join(30)
        waiting.join(30)
        assert len(answers) == 1 and isinstance(answers[0], ReadsBusy)
        assert pool.run(lambda: "counted") == "counted"  # a free thread: it runs
    finally:
        release.set()
        pool.stop()


def test_the_read_budget_setting():
    assert Config.from_env({}).read_budget == 1.8  # the service's default
    assert Config().read_budget is None  # built in code: no bound unless asked
    assert Config.from_env({"TALLY_READ_BUDGET": "0.5"}).read_budget == 0.5
    for bad in ("0", "-1", "soon", "3601"):
        with pytest.raises(ConfigError, match="TALLY_READ_BUDGET"):
            Config.from_env({"TALLY_READ_BUDGET": bad})


# Through the service ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world_db(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("budget") / "seed.db")
    return (db, *seed.world(db))


@pytest.fixture
def world(world_db, db_path):
    source, made, now = world_db
    return made, copy_database(source, db_path), now


def stored(db: str) -> dict[str, int]:
    return {table: rows(db, f"SELECT count(*) AS n FROM {table}")[0]["n"]  # noqa: S608 - fixed names
            for table in ("traffic_days", "traffic_day_values", "traffic_segments",
                          "traffic_segment_days", "traffic_segment_values")}


def test_a_report_past_its_budget_is_422_and_the_next_request_is_served(world):
    made, db, now = world
    clock = FakeClock(now + 3 * 86_400)
    tally = create_app(config_for(db, read_budget=0.0, read_budget_check_steps=100,
                                  read_threads=1), clock=clock)
    client = webtest.TestApp(tally)
    headers = bearer(made["a"]["key"])
    paths = ("/api/v1/stats/timeseries?interval=hour&compare=previous_period"
             "&filters=page~a|e;source~o",
             "/api/v1/stats/aggregate",
             "/api/v1/stats/breakdown?by=page&filters=page~e;device==desktop",
             "/api/v1/stats/funnel?steps=page:/*,goal:signup,payment&filters=page~e",
             "/api/v1/stats/breakdown?by=campaign")
    before = stored(db)
    try:
        for path in paths:
            answer = client.get(path, headers=headers, status=422)
            assert answer.json == {"ok": False, "error": {
                "code": "query_too_expensive", "message": too_expensive(0.0)}}
            assert "narrow it" in answer.json["error"]["message"]
        assert stored(db) == before  # nothing half-counted kept
        # The read thread's connection, as the stops left it, serves the next reads.
        tally.reads.seconds = None
        assert tally.reads.run(lambda: tally.db.conn().in_transaction) is False
        assert tally.reads.run(lambda: statement_timeout(tally.db)) in (None, "0")
        served = {path: client.get(path, headers=headers, status=200).json for path in paths}
        assert served[paths[1]]["data"]["visitors"] > 0
    finally:
        tally.stop(timeout=5)

    restarted = create_app(config_for(db), clock=clock)  # a new process, on what was stored
    try:
        again = webtest.TestApp(restarted)
        for path in paths:
            assert again.get(path, headers=headers, status=200).json == served[path]
    finally:
        restarted.stop(timeout=5)


def _sign_in(client, email):
    page = client.get("/login")
    form = page.forms[0]
    form["email"], form["password"] = email, seed.PASSWORD
    form.submit(status=303, extra_environ={"REMOTE_ADDR": "192.0.2.10"})


def test_dashboard_and_shared_pages_past_the_budget_say_how_to_narrow(world):
    made, db, now = world
    clock = FakeClock(now)
    app = create_app(config_for(db, read_budget=0.0, read_budget_check_steps=100), clock=clock)
    try:
        client = webtest.TestApp(app)
        _sign_in(client, made["a"]["email"])
        site = made["a"]["site"]
        owner = client.get(f"/sites/{site}?period=7d&filters=page~e", status=422)
        assert "Too much to count" in owner.text and "narrow it" in owner.text
        assert f'href="/sites/{site}"' in owner.text and "Traceback" not in owner.text
        revenue = client.get(f"/sites/{site}/revenue", status=422)
        assert "narrow it" in revenue.text
        funnel = client.get(f"/sites/{site}/funnels?steps=page:/*,payment", status=422)
        assert "narrow it" in funnel.text
        home = client.get("/", status=200)  # the list of sites, without figures
        assert made["a"]["host"] in home.text
        from storage.shares import SharedLinks

        token = SharedLinks(app.db, clock).create(site, revenue=True)["token"]
        shared = webtest.TestApp(app).get(f"/share/{token}?period=7d&filters=page~e",
                                          status=422)
        assert "Too much to count" in shared.text and "narrow it" in shared.text
        assert webtest.TestApp(app).get(f"/share/{token}/live", status=422).json == {
            "visitors": None}
    finally:
        app.stop(timeout=5)
    served = create_app(config_for(db), clock=clock)
    try:
        page = webtest.TestApp(served).get(f"/share/{token}?period=7d&filters=page~e",
                                           status=200)
        assert "Too much to count" not in page.text
    finally:
        served.stop(timeout=5)


def test_shared_link_viewers_cannot_take_the_owners_read_threads(world):
    """Reads of shared links run on threads of their own: with those all taken, the
    site's key is still served."""
    made, db, now = world
    tally = create_app(config_for(db, read_threads=1), clock=FakeClock(now))
    holding, release = threading.Event(), threading.Event()
    viewer = threading.Thread(target=tally.anonymous_reads.run,
                              args=(lambda: holding.set() or release.wait(60),))
    try:
        viewer.start()
        assert holding.wait(30)
        answers = []
        owner = threading.Thread(target=lambda: answers.append(webtest.TestApp(tally).get(
            "/api/v1/stats/aggregate", headers=bearer(made["a"]["key"])).status_int))
        owner.start()
        owner.join(30)
        assert answers == [200]
    finally:
        release.set()
        viewer.join(30)
        tally.stop(timeout=5)
