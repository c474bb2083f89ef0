"""The SQL behind revenue by first touch, revenue over time and goals.

Customers are selected by their first touch in Python (reports.filters.touch_matches),
over one row per customer read here; money is read as decimal text and added up exactly.
"""

from __future__ import annotations

import sqlite3
from decimal import Decimal

import orjson

from reports.mrr_series import values_at_instants
from reports.queries import SqlSubscriptions
from reports.revenue import PaymentRow
from reports.timeseries import RevenuePayment
from storage.dialect import dialect, integer_of_text
from storage.sessions import first_touch_join

# Each customer's first-touch session, and that session's first event (its earliest, a
# seek in events_site_ts at the session's start; $identify only when nothing else).
_FIRST_TOUCHES = (
    "SELECT c.customer_id, fs.channel, fs.source, fs.utm_medium, fs.utm_campaign,"  # noqa: S608 - fixed alias
    " fs.utm_term, fs.utm_content, fs.referrer, fs.landing_page, fs.entry_path, fs.started_at,"
    " e.pathname, e.hostname, e.country, e.device, e.browser, e.os, e.name, e.props"
    " FROM customers c"
    + first_touch_join("c")  # sql-safe: a fixed alias
    + " LEFT JOIN events e ON e.id = ("
    "  SELECT e2.id FROM events e2"
    "   WHERE e2.site_id = fs.site_id AND e2.ts = fs.started_at AND e2.session_id = fs.id"
    "   ORDER BY e2.name = '$identify', e2.id LIMIT 1)"
    " WHERE c.site_id = ? AND fs.id IS NOT NULL"
)
TOUCH_FIELDS = ("channel", "source", "medium", "campaign", "term", "content", "referrer",
                "landing_page", "entry_page", "started_at", "page", "hostname", "country",
                "device", "browser", "os", "event", "props")

# Succeeded payments dated in [t0, t1), alike ones grouped with their count.
_REVENUE_ROWS = (
    "SELECT customer_id, kind, currency, amount, fee, count(*) FROM payments"
    " WHERE site_id = ? AND paid_at_ms >= ? AND paid_at_ms < ? AND status = 'succeeded'"
    " GROUP BY customer_id, kind, currency, amount, fee"
)
# Succeeded payments dated in [t0, t1), alike ones grouped per bucket of `width` ms.
_PAYMENTS_BY_BUCKET = (
    "SELECT customer_id, kind, currency, amount, paid_at_ms / ?4 AS bucket, count(*)"
    " FROM payments WHERE site_id = ?1 AND paid_at_ms >= ?2 AND paid_at_ms < ?3"
    " AND status = 'succeeded'"
    " GROUP BY customer_id, kind, currency, amount, bucket"
)
_FIRST_CHARGES = (
    "SELECT customer_id, currency, min(paid_at_ms) FROM payments"
    " WHERE site_id = ? AND kind = 'charge' AND status = 'succeeded'"
    " GROUP BY customer_id, currency"
)
# Customers (given as a JSON array) with a succeeded charge.
_PAYING = (
    "SELECT DISTINCT customer_id FROM payments"
    " WHERE site_id = ?1 AND kind = 'charge' AND status = 'succeeded'"
    " AND customer_id IN (SELECT value FROM json_each(?2))"
)
# Each customer's plan: that of its subscription observed last.
_PLANS = (
    "SELECT customer_id, plan FROM subscriptions WHERE site_id = ?"
    " ORDER BY customer_id, effective_at_ms, id"
)


def first_touches(conn: sqlite3.Connection, site_id: int) -> dict[str, dict]:
    """customer id -> its first touch (TOUCH_FIELDS); customers without one are absent."""
    touches = {}
    for customer, *values in conn.execute(_FIRST_TOUCHES, (site_id,)):
        touch = dict(zip(TOUCH_FIELDS, values, strict=True))
        props = touch["props"]
        touch["props"] = orjson.loads(props) if props else {}
        touches[customer] = touch
    return touches


def payments_by_bucket(conn: sqlite3.Connection, site_id: int, t0: int, t1: int,
                       width: int) -> list[RevenuePayment]:
    return [RevenuePayment(customer, kind, currency, Decimal(amount), bucket * width, count)
            for customer, kind, currency, amount, bucket, count in conn.execute(
                _PAYMENTS_BY_BUCKET, (site_id, t0, t1, width))]


def first_charges(conn: sqlite3.Connection, site_id: int) -> dict[tuple[str, str], int]:
    return {(customer, currency): at for customer, currency, at in conn.execute(
        _FIRST_CHARGES, (site_id,))}


def paying_customers(conn: sqlite3.Connection, site_id: int, customers: list[str]) -> set[str]:
    if not customers:
        return set()
    wanted = orjson.dumps(sorted(customers)).decode()
    return {row[0] for row in conn.execute(_PAYING, (site_id, wanted))}


def plans(conn: sqlite3.Connection, site_id: int) -> dict[str, str | None]:
    return {customer: plan for customer, plan in conn.execute(_PLANS, (site_id,))}


def mrr_yearly_at(conn: sqlite3.Connection, site_id: int,
                  instants: list[int]) -> dict[int, dict[tuple[str, str], Decimal]]:
    """Each customer's yearly subscription value per currency at each instant."""
    if not instants:
        return {}
    return values_at_instants(SqlSubscriptions(conn, site_id), sorted(set(instants)))


def revenue_rows(conn: sqlite3.Connection, site_id: int, t0: int, t1: int) -> list[PaymentRow]:
    return [PaymentRow(customer, kind, "succeeded", currency, Decimal(amount),
                       None if fee is None else Decimal(fee), count)
            for customer, kind, currency, amount, fee, count in conn.execute(
                _REVENUE_ROWS, (site_id, t0, t1))]


# Customers linked now to a visitor id (customer.visitor_id, or user_id -> $identify) that
# did a custom event in [t0, t1): (event name, customer id). The linked visitors' sessions
# come from session_visitors, and each session's events from a seek in events_site_ts over
# the session's own time span, so only the customers' visits are read, not the range.
_CONVERTED_CUSTOMERS = {name: (
    "WITH linked (customer_id, visitor_id) AS ("  # noqa: S608 - fixed fragments by dialect
    f" SELECT customer_id, {integer_of_text(name, 'visitor_id')} FROM customers"
    "  WHERE site_id = ?1 AND visitor_id IS NOT NULL"
    " UNION"
    " SELECT c.customer_id, vi.visitor_id FROM customers c"
    "  JOIN visitor_identities vi ON vi.site_id = c.site_id AND vi.uid = c.user_id"
    "  WHERE c.site_id = ?1)"
    " SELECT DISTINCT e.name, l.customer_id"
    " FROM linked l"
    " CROSS JOIN session_visitors sv CROSS JOIN sessions s CROSS JOIN events e"
    " WHERE sv.site_id = ?1 AND sv.visitor_id = l.visitor_id"
    " AND s.id = sv.session_id"
    " AND e.site_id = ?1 AND e.ts >= max(s.started_at, ?2)"
    " AND e.ts <= min(s.last_seen_at, ?3 - 1) AND e.session_id = s.id"
    " AND s.last_seen_at >= ?2 AND s.started_at < ?3"
    " AND e.name <> 'pageview' AND e.name <> '$identify'"
) for name in ("sqlite", "postgres")}


def converted_customers(conn: sqlite3.Connection, site_id: int, t0: int,
                        t1: int) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for name, customer in conn.execute(_CONVERTED_CUSTOMERS[dialect(conn)],
                                        (site_id, t0, t1)):
        result.setdefault(name, set()).add(customer)
    return result


_REALTIME_VISITORS = (
    "SELECT count(DISTINCT visitor_id) FROM events"
    " WHERE site_id = ? AND ts >= ? AND name <> '$identify'"
)
_REALTIME_MINUTES = (
    "SELECT ts / 60000, count(*) FROM events"
    " WHERE site_id = ? AND ts >= ? AND name = 'pageview' GROUP BY 1"
)
_REALTIME_PAGES = (
    "SELECT pathname, count(DISTINCT visitor_id), count(*) FROM events"
    " WHERE site_id = ? AND ts >= ? AND name = 'pageview' GROUP BY pathname"
)
_REALTIME_SOURCES = (
    "SELECT s.source, count(DISTINCT e.visitor_id) FROM events e"
    " JOIN sessions s ON s.id = e.session_id"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.name <> '$identify' GROUP BY s.source"
)


def realtime_counts(conn: sqlite3.Connection, site_id: int, visitors_since: int,
                    since: int) -> tuple[int, dict[int, int], list, list]:
    visitors = conn.execute(_REALTIME_VISITORS, (site_id, visitors_since)).fetchone()[0]
    minutes = dict(conn.execute(_REALTIME_MINUTES, (site_id, since)).fetchall())
    pages = conn.execute(_REALTIME_PAGES, (site_id, since)).fetchall()
    sources = conn.execute(_REALTIME_SOURCES, (site_id, since)).fetchall()
    return visitors, minutes, pages, sources
