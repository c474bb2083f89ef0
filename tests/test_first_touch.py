"""First touch has one definition (storage.sessions.FIRST_TOUCHES); the triggers of each
schema keep customer_first_touch equal to it row by row, on both engines, after every kind
of write that can move it: a session and its visitor (refreshed by its writer through
storage.sessions.first_touch_of_new_sessions, as the flush does), another visitor joining
a session, a $identify link, a customer, a customer's links changing, a session found to
start earlier. The flush's own writes are checked too: a new session carries its first
visitor id in sessions.visitor_id alone, and only a session continued under another id
gets a link."""

from __future__ import annotations

import random

import pytest

from attribution.sessions import Hit, SessionWriter
from storage.sessions import (
    defined_first_touches,
    first_touch_of_new_sessions,
    stored_first_touches,
)

SITE_ID = 1
T0 = 1_790_000_000_000


def _step(conn, rnd: random.Random, state: dict) -> str:
    kind = rnd.choice(("session", "session", "link", "identity", "customer", "relink",
                       "earlier"))
    sessions, customers = state["sessions"], state["customers"]
    if kind == "link" and sessions:
        conn.execute("INSERT INTO session_visitors (site_id, visitor_id, session_id)"
                     " VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                     (SITE_ID, rnd.randrange(1, 9), rnd.choice(sessions)))
    elif kind == "identity":
        conn.execute("INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
                     " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                     (SITE_ID, f"u{rnd.randrange(4)}", rnd.randrange(1, 9), T0))
    elif kind == "customer":
        customer = f"c{len(customers)}"
        customers.append(customer)
        conn.execute("INSERT INTO customers (site_id, customer_id, user_id, visitor_id, as_of_ms,"
                     " created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0, 0)",
                     (SITE_ID, customer, rnd.choice((None, "u0", "u1", "u2")),
                      rnd.choice((None, "1", "2", "3", "4", "5", "x"))))
    elif kind == "relink" and customers:
        conn.execute("UPDATE customers SET user_id = ?, visitor_id = ? WHERE customer_id = ?",
                     (rnd.choice((None, "u0", "u3")), rnd.choice((None, "6", "7", "8")),
                      rnd.choice(customers)))
    elif kind == "earlier" and sessions:
        conn.execute("UPDATE sessions SET started_at = started_at - ? WHERE id = ?",
                     (rnd.randrange(1, 5) * 60_000, rnd.choice(sessions)))
    else:
        session = len(sessions) + 1
        sessions.append(session)
        started = T0 + rnd.randrange(0, 10) * 60_000  # ties broken by id
        visitor = rnd.randrange(1, 9)
        # Its visitor id is sessions.visitor_id; session_visitors holds only others. Its
        # writer refreshes the first touches it can move, as the flush does.
        conn.execute("INSERT INTO sessions (id, site_id, visitor_id, started_at, last_seen_at,"
                     " channel) VALUES (?, ?, ?, ?, ?, 'Direct')",
                     (session, SITE_ID, visitor, started, started + 60_000))
        first_touch_of_new_sessions(conn, [(SITE_ID, visitor)])
    return kind


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_triggers_keep_first_touch_as_defined(store, seed):
    rnd = random.Random(seed)
    state = {"sessions": [], "customers": []}
    for n in range(60):
        with store.transaction() as conn:
            kind = _step(conn, rnd, state)
        conn = store.conn()
        assert stored_first_touches(conn) == defined_first_touches(conn), (seed, n, kind)
    assert any(session is not None for *_, session in defined_first_touches(store.conn()))


@pytest.mark.xfail(strict=True, reason=(
    "a customer.visitor_id that spells its visitor another way ('03' for 3) is linked when"
    " the customer is written (refresh_run compares as numbers, as the definition does) but"
    " not when the session comes later (first_touch_of_new_sessions compares texts),"
    " on both engines: the figure depends on the order of arrival. Left for a schema change"))
def test_a_visitor_id_spelled_another_way_links_whatever_the_order(store):
    with store.transaction() as conn:
        conn.execute("INSERT INTO customers (site_id, customer_id, visitor_id, as_of_ms,"
                     " created_at, updated_at) VALUES (?, 'c', '03', 0, 0, 0)", (SITE_ID,))
        conn.execute("INSERT INTO sessions (id, site_id, visitor_id, started_at, last_seen_at,"
                     " channel) VALUES (1, ?, 3, ?, ?, 'Direct')", (SITE_ID, T0, T0))
        first_touch_of_new_sessions(conn, [(SITE_ID, 3)])
    conn = store.conn()
    assert defined_first_touches(conn) == [(SITE_ID, "c", 1)]
    assert stored_first_touches(conn) == defined_first_touches(conn)


MIDNIGHT = 1_790_035_200_000  # 2026-09-23 00:00 UTC
GAP = 10 * 60_000


def _hit(ts: int, visitor: int, previous: int | None = None, uid: str | None = None,
         name: str = "pageview") -> Hit:
    return Hit(SITE_ID, visitor, ts, name, "https://example.com/", "/", None, None,
               (None,) * 5, (), uid, previous)


def _customer(conn, customer: str, visitor: str | None = None, user: str | None = None) -> None:
    conn.execute("INSERT INTO customers (site_id, customer_id, user_id, visitor_id, as_of_ms,"
                 " created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0, 0)",
                 (SITE_ID, customer, user, visitor))


def _flush(store, *hits: Hit) -> list[int | None]:
    with store.transaction() as conn:
        return SessionWriter(lambda conn, site: ()).record(conn, list(hits))


def _touches(store) -> dict[str, int | None]:
    conn = store.conn()
    assert stored_first_touches(conn) == defined_first_touches(conn)
    return {customer: session for _, customer, session in stored_first_touches(conn)}


def test_a_customers_visitor_gets_its_first_session_from_the_flush(store):
    with store.transaction() as conn:
        _customer(conn, "by_visitor", visitor="5")
        _customer(conn, "by_user", user="u5")
        conn.execute("INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
                     " VALUES (?, 'u5', 6, 0)", (SITE_ID,))
    assert _touches(store) == {"by_visitor": None, "by_user": None}
    first, second = _flush(store, _hit(T0, 5), _hit(T0 + 60_000, 6))
    assert _touches(store) == {"by_visitor": first, "by_user": second}
    links = store.conn().execute("SELECT count(*) FROM session_visitors").fetchone()[0]
    assert links == 0  # each session's one visitor id is sessions.visitor_id
    # A later session of the same visitor moves nothing.
    (later,) = _flush(store, _hit(T0 + 3 * 3_600_000, 5))
    assert later not in (first, second)
    assert _touches(store) == {"by_visitor": first, "by_user": second}


@pytest.mark.parametrize("linked", ["yesterday", "today", "uid_today"])
def test_a_visit_across_midnight_is_the_first_touch_of_either_visitor_id(store, linked):
    yesterday, today = 101, 102
    with store.transaction() as conn:
        if linked == "yesterday":
            _customer(conn, "c", visitor=str(yesterday))
        elif linked == "today":
            _customer(conn, "c", visitor=str(today))
        else:
            _customer(conn, "c", user="u1")
    (opened,) = _flush(store, _hit(MIDNIGHT - GAP, yesterday))
    assert _touches(store) == {"c": opened if linked == "yesterday" else None}
    # After midnight the same visit goes on under today's id, found through yesterday's.
    continued, _ = _flush(store, _hit(MIDNIGHT + GAP, today, previous=yesterday),
                          _hit(MIDNIGHT + GAP + 1, today, previous=yesterday, uid="u1",
                               name="$identify"))
    assert continued == opened
    conn = store.conn()
    assert conn.execute("SELECT site_id, visitor_id, session_id FROM session_visitors"
                        ).fetchall() == [(SITE_ID, today, opened)]
    assert sorted(conn.execute("SELECT visitor_id FROM session_links WHERE session_id = ?",
                               (opened,)).fetchall()) == [(yesterday,), (today,)]
    assert _touches(store) == {"c": opened}
    # A later visit under today's id alone is not the first touch.
    (later,) = _flush(store, _hit(MIDNIGHT + 5 * 3_600_000, today, previous=yesterday))
    assert later != opened
    assert _touches(store) == {"c": opened}
