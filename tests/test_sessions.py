"""Sessions, identity links and first touch, written the way the events flush writes them.

Hits go through SessionWriter.record inside a real transaction on the real SQLite file;
customers arrive through POST /api/v1/payments, so the triggers see the payments code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest

from attribution.first_touch import customer_attribution, customer_channels
from attribution.sessions import Hit, SessionWriter
from enrichment.urls import campaign, url_host
from tests.conftest import bearer
from vocabulary import CLICK_IDS

T0 = int(datetime(2026, 9, 21, 12, 0, tzinfo=UTC).timestamp() * 1000)
MIN = 60_000
GOOGLE = "https://www.google.co.uk/"
PAGE = "https://example.com/pricing"


def make_hit(site_id, ts, visitor, name, url, referrer=None, uid=None, previous=None) -> Hit:
    """A Hit with the URL pieces parsed the way enrichment parses them for the events table."""
    found = campaign(url)
    clicks = tuple(key for key, value in zip(CLICK_IDS, found[5:], strict=True) if value)
    return Hit(site_id, visitor, ts, name, url, urlsplit(url).path or "/", referrer,
               url_host(referrer), found[:5], clicks, uid, previous)


@pytest.fixture
def env(tally, client, site):
    site_id = tally.directory.find_site(site["site"]["id"]).id
    writer = SessionWriter()

    def record(*hits: Hit) -> list[int | None]:
        with tally.db.transaction() as conn:
            return writer.record(conn, list(hits))

    def hit(ts, visitor=1, name="pageview", url=PAGE, referrer=None, uid=None, previous=None):
        return make_hit(site_id, ts, visitor, name, url, referrer, uid, previous)

    def pay(customer: dict, payment_id="pay_1", paid_at="2026-09-22T10:00:00Z"):
        body = {"payment_id": payment_id, "amount": 10, "currency": "EUR", "kind": "charge",
                "paid_at": paid_at, "customer": customer}
        client.post_json("/api/v1/payments", body, headers=bearer(site["key"]))

    def sessions():
        return tally.db.conn().execute(
            "SELECT id, visitor_id, started_at, last_seen_at, channel, source, landing_page,"
            " entry_path, utm_source, pageviews, custom_events FROM sessions WHERE site_id = ?"
            " ORDER BY started_at", (site_id,)).fetchall()

    def attribution(customer_id):
        return customer_attribution(tally.db.conn(), site_id, customer_id)

    class Env:
        pass

    e = Env()
    e.site_id, e.record, e.hit, e.pay, e.sessions, e.attribution = (
        site_id, record, hit, pay, sessions, attribution)
    e.conn = tally.db.conn
    return e


def test_gaps_of_at_most_30_minutes_make_one_session(env):
    ids = env.record(
        env.hit(T0, referrer=GOOGLE),
        env.hit(T0 + 29 * MIN, name="signup"),
        env.hit(T0 + 59 * MIN),  # exactly 30 minutes after the previous one
        env.hit(T0 + 89 * MIN + 1),  # 30 minutes and 1 ms: a new session
    )
    assert ids[0] == ids[1] == ids[2] != ids[3]
    rows = env.sessions()
    assert [(r[2], r[3], r[9], r[10]) for r in rows] == [
        (T0, T0 + 59 * MIN, 2, 1), (T0 + 89 * MIN + 1, T0 + 89 * MIN + 1, 1, 0)]
    assert [r[4] for r in rows] == ["Organic Search", "Direct"]


def test_a_session_continues_across_flushes(env):
    first = env.record(env.hit(T0, referrer=GOOGLE))
    second = env.record(env.hit(T0 + 20 * MIN, referrer="https://t.co/abc"))
    assert first == second
    (row,) = env.sessions()
    assert row[4:6] == ("Organic Search", "Google") and row[9] == 2


def test_the_first_event_fixes_source_channel_landing_page_and_utm(env):
    url = "https://example.com/landing?utm_source=newsletter&utm_medium=email&utm_campaign=fall"
    env.record(env.hit(T0, url=url, referrer=GOOGLE),
               env.hit(T0 + MIN, url="https://example.com/buy?utm_source=other"))
    (row,) = env.sessions()
    assert row[4:9] == ("Email", "newsletter", url, "/landing", "newsletter")


def test_an_earlier_event_flushed_later_becomes_the_first_event(env):
    # Another worker flushed the second pageview (an internal referrer) first.
    env.record(env.hit(T0 + 5 * MIN, referrer="https://example.com/"))
    assert env.sessions()[0][4] == "Direct"
    env.record(env.hit(T0, url="https://example.com/from-google", referrer=GOOGLE))
    (row,) = env.sessions()
    assert row[2:8] == (T0, T0 + 5 * MIN, "Organic Search", "Google",
                        "https://example.com/from-google", "/from-google")
    assert row[9] == 2


def test_a_session_crosses_midnight_under_the_previous_days_visitor_id(env):
    midnight = int(datetime(2026, 9, 22, tzinfo=UTC).timestamp() * 1000)
    env.record(env.hit(midnight - 10 * MIN, visitor=101, referrer=GOOGLE))
    ids = env.record(env.hit(midnight + 10 * MIN, visitor=102, previous=101))
    (row,) = env.sessions()
    assert ids == [row[0]] and row[3] == midnight + 10 * MIN
    visitors = env.conn().execute(
        "SELECT visitor_id FROM session_links WHERE session_id = ? ORDER BY visitor_id",
        (row[0],)).fetchall()
    assert visitors == [(101,), (102,)]
    # Long after midnight, yesterday's id no longer continues anything.
    env.record(env.hit(midnight + 60 * MIN, visitor=102, previous=101))
    assert len(env.sessions()) == 2


def test_one_batch_spanning_midnight_keeps_one_session(env):
    midnight = int(datetime(2026, 9, 22, tzinfo=UTC).timestamp() * 1000)
    # Today's id comes first in the batch, yet yesterday's event opened the visit.
    ids = env.record(env.hit(midnight + 2 * MIN, visitor=102, previous=101),
                     env.hit(midnight - 2 * MIN, visitor=101, referrer=GOOGLE))
    assert ids[0] == ids[1]
    (row,) = env.sessions()
    assert row[4] == "Organic Search" and row[9] == 2


def test_events_without_a_visitor_and_identify_open_no_session(env):
    ids = env.record(env.hit(T0, visitor=None),
                     env.hit(T0, name="$identify", uid="user-1", referrer=GOOGLE))
    assert ids == [None, None] and env.sessions() == []
    links = env.conn().execute("SELECT uid, visitor_id FROM visitor_identities").fetchall()
    assert links == [("user-1", 1)]


def test_first_touch_through_identify_and_user_id(env):
    env.record(env.hit(T0, referrer=GOOGLE), env.hit(T0 + 3 * 3600_000, referrer="https://t.co/x"))
    env.record(env.hit(T0 + 4 * 3600_000, name="$identify", uid="user-1"))
    env.pay({"id": "cus_1", "user_id": "user-1"})
    attribution = env.attribution("cus_1")
    assert attribution == {
        "channel": "Organic Search", "source": "Google", "referrer": GOOGLE,
        "landing_page": PAGE,
        "utm": {"source": None, "medium": None, "campaign": None, "term": None, "content": None},
        "first_seen": "2026-09-21T12:00:00.000Z",
    }


def test_an_identify_after_the_payment_re_attributes_it(env):
    env.record(env.hit(T0, visitor=9, referrer="https://chatgpt.com/"))
    env.pay({"id": "cus_1", "user_id": "user-1"})
    assert env.attribution("cus_1")["channel"] == "Unattributed"
    env.record(env.hit(T0 + MIN, visitor=9, name="$identify", uid="user-1"))
    assert env.attribution("cus_1")["channel"] == "AI Assistants"


def test_customer_visitor_id_links_directly_and_the_earliest_session_wins(env):
    env.record(env.hit(T0 + 3600_000, visitor=20, referrer="https://t.co/x"))
    env.record(env.hit(T0 + 7200_000, visitor=-21, referrer=GOOGLE))
    env.record(env.hit(T0 + 7200_000 + MIN, visitor=20, name="$identify", uid="user-1"))
    env.pay({"id": "cus_1", "user_id": "user-1", "visitor_id": "-21"})
    assert env.attribution("cus_1")["channel"] == "Organic Social"
    # A session of a linked visitor that starts earlier, arriving later, takes over.
    env.record(env.hit(T0, visitor=-21, url="https://example.com/?gclid=abc"))
    assert env.attribution("cus_1")["channel"] == "Paid Search"
    assert env.attribution("cus_1")["source"] == "Google"


def test_a_late_earlier_event_changes_the_first_touch(env):
    env.record(env.hit(T0 + 5 * MIN, visitor=5))
    env.pay({"id": "cus_5", "visitor_id": "5"})
    assert env.attribution("cus_5")["channel"] == "Direct"
    env.record(env.hit(T0, visitor=5, referrer="https://www.youtube.com/watch?v=1"))
    assert env.attribution("cus_5")["channel"] == "Organic Video"
    assert env.attribution("cus_5")["first_seen"] == "2026-09-21T12:00:00.000Z"


def test_a_new_user_id_on_the_customer_re_attributes_it(env):
    env.record(env.hit(T0, visitor=31, referrer=GOOGLE), env.hit(T0, visitor=32))
    env.record(env.hit(T0 + MIN, visitor=31, name="$identify", uid="user-a"),
               env.hit(T0 + MIN, visitor=32, name="$identify", uid="user-b"))
    env.pay({"id": "cus_1", "user_id": "user-b"}, paid_at="2026-09-22T10:00:00Z")
    assert env.attribution("cus_1")["channel"] == "Direct"
    env.pay({"id": "cus_1", "user_id": "user-a"}, payment_id="pay_2",
            paid_at="2026-09-23T10:00:00Z")
    assert env.attribution("cus_1")["channel"] == "Organic Search"


def test_identify_just_after_midnight_also_links_the_open_session(env):
    midnight = int(datetime(2026, 9, 22, tzinfo=UTC).timestamp() * 1000)
    env.record(env.hit(midnight - 5 * MIN, visitor=101, referrer=GOOGLE))
    env.record(env.hit(midnight + 5 * MIN, visitor=102, previous=101,
                       name="$identify", uid="user-1"))
    env.pay({"id": "cus_1", "user_id": "user-1"})
    assert env.attribution("cus_1")["channel"] == "Organic Search"


def test_customer_channels_for_reports(env):
    env.record(env.hit(T0, visitor=40, referrer=GOOGLE))
    env.pay({"id": "cus_g", "visitor_id": "40"})
    env.pay({"id": "cus_none"}, payment_id="pay_2")
    conn = env.conn()
    assert customer_channels(conn, env.site_id) == {
        "cus_g": "Organic Search", "cus_none": "Unattributed"}
    assert customer_channels(conn, env.site_id, ["cus_none", "cus_g", "cus_unknown"]) == {
        "cus_none": "Unattributed", "cus_g": "Organic Search", "cus_unknown": "Unattributed"}


def test_sessions_are_per_site(env, tally, site):
    other_site = tally.directory.create_site(site["account"]["id"], ["other.example"])
    other_id = tally.directory.find_site(other_site["id"]).id
    env.record(env.hit(T0, visitor=1, referrer=GOOGLE))
    env.record(Hit(other_id, 1, T0 + MIN, "pageview", "https://other.example/"))
    assert len(env.sessions()) == 1
    env.pay({"id": "cus_1", "visitor_id": "1"})
    assert env.attribution("cus_1")["first_seen"] == "2026-09-21T12:00:00.000Z"
