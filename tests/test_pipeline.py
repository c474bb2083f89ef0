"""The events flush's named steps: typed rows that match the table, each step's output."""

from __future__ import annotations

import gc

import iptocc
import pytest

from enrichment.enricher import Enricher, previous_visitor_ids
from ingest import pipeline
from ingest.queue import Accepted
from storage.events import EVENT_COLUMNS, EventRow, SiteNotStored, refuse_missing_sites
from storage.sessions import final_session_ids
from tests.conftest import FakeClock, counting_bytes, is_postgres
from validation.event import parse_events
from vocabulary import IDENTIFY

NOW_MS = 1_790_000_000_000


@pytest.fixture
def db(one_site_db):
    return one_site_db


def unit(*elements: dict) -> Accepted:
    events = parse_events({"s": "s", "b": list(elements)}, NOW_MS)[1]
    counted = sum(1 for event in events if event.name != IDENTIFY)
    return Accepted(1, 1, "2026-09", NOW_MS // 86_400_000, events, counted)


def test_an_event_row_has_the_columns_of_the_events_table(db):
    columns = [column[0] for column in db.conn().execute("SELECT * FROM events").description]
    # anonymous came in version 16: ADD COLUMN put it last, so new files have it there too.
    assert columns == ["id", *EventRow._fields[:-1], "session_id", "anonymous"]
    assert EVENT_COLUMNS == (*EventRow._fields, "session_id")


def test_each_step_hands_the_next_its_typed_input(db):
    enricher = Enricher(db, FakeClock(NOW_MS / 1000), counting_bytes())
    who = {"ip": "81.2.69.142", "ua": "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0"}
    conn = db.conn()
    batch = pipeline.enrich(enricher, conn, [unit(
        {"e": "pageview", "u": "https://example.com/a?utm_source=news&gclid=x",
         "r": "https://www.google.com/", **who},
        {"e": IDENTIFY, "u": "https://example.com/a", "uid": "user-1", **who})])
    first, second = batch.rows
    assert isinstance(first, EventRow)
    assert (first.pathname, first.referrer_host, first.utm_source, first.gclid, first.country,
            first.browser) == ("/a", "www.google.com", "news", "x", "GB", "Firefox")
    assert first.visitor_id == second.visitor_id is not None
    # The $identify reaches back a day, but no salt of the day before exists.
    assert [index for index, *_ in batch.reaching_back] == [1]
    assert previous_visitor_ids(conn, batch) == [None, None]
    assert batch.usage == {(1, "2026-09"): 1}
    with db.transaction(conn):
        pipeline.write_batch(conn, batch)
    stored = conn.execute("SELECT name, session_id FROM events ORDER BY id").fetchall()
    assert stored == [("pageview", 1), (IDENTIFY, None)]
    assert batch.usage_totals == {(1, "2026-09"): 1}


def test_the_collector_waits_while_a_step_runs_and_only_then():
    assert gc.isenabled()
    with pipeline.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with pipeline.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_the_site_check_takes_the_new_sessions_ids_in_its_statement(db, db_path):
    enricher = Enricher(db, FakeClock(NOW_MS / 1000), counting_bytes())
    conn = db.conn()
    batch = pipeline.enrich(enricher, conn, [unit(
        {"e": "pageview", "u": "https://example.com/a", "ip": "81.2.69.142", "ua": "curl/8"})])
    removed = [row._replace(site_id=2) for row in batch.rows]
    with db.transaction(conn):
        if not is_postgres(db_path):  # SQLite's foreign keys check; its ids come later
            assert refuse_missing_sites(conn, batch.rows, 3) is None
            assert refuse_missing_sites(conn, removed, 3) is None
            return
        taken = refuse_missing_sites(conn, batch.rows, 3)
        assert taken == sorted(taken) and len(set(taken)) == 3
        assert refuse_missing_sites(conn, batch.rows) == []
        later = final_session_ids(conn, 2)
        assert min(later) > max(taken)
        for new_sessions in (0, 2):
            with pytest.raises(SiteNotStored, match="site 2 is not stored"):
                refuse_missing_sites(conn, batch.rows + removed, new_sessions)


def test_enrich_remembers_each_page_bounded(db):
    """A page's path and campaign values are found once per URL (Enricher._pages): a
    repeat gets the same, an IPv6 visitor its country too, and the memo is bounded in
    entries (cache_entries) and in the length of the URLs it keeps."""
    enricher = Enricher(db, FakeClock(NOW_MS / 1000), counting_bytes(), cache_entries=3)
    who = {"ip": "2a02:8108::1", "ua": "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0"}
    page = "https://example.com/a/b?utm_source=news&utm_medium=mail#top"
    conn = db.conn()
    rows = pipeline.enrich(enricher, conn, [unit({"e": "pageview", "u": page, **who},
                                                 {"e": "pageview", "u": page, **who})]).rows
    assert [(row.pathname, row.utm_source, row.utm_medium, row.utm_campaign) for row in rows] == [
        ("/a/b", "news", "mail", None)] * 2
    assert rows[0].country == iptocc.country_code("2a02:8108::1") is not None
    assert page in enricher._pages
    pages = [f"https://example.com/{n}?gclid=g{n}" for n in range(5)]
    rows = pipeline.enrich(enricher, conn, [unit(*({"e": "pageview", "u": url} for url in pages))]).rows
    assert [(row.pathname, row.gclid) for row in rows] == [(f"/{n}", f"g{n}") for n in range(5)]
    assert len(enricher._pages) <= 3
    long_page = "https://example.com/" + "a" * 1_100 + "?utm_source=x"
    (row,) = pipeline.enrich(enricher, conn, [unit({"e": "pageview", "u": long_page})]).rows
    assert (row.pathname, row.utm_source) == ("/" + "a" * 1_100, "x")
    assert long_page not in enricher._pages
