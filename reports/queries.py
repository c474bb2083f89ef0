"""The SQL behind the reports: read a site's rows, hand them to the pure functions.

Every statement is parameterized; the breakdown splices one column name taken from the
fixed BREAKDOWN_COLUMNS mapping, never from the request. Traffic is counted by SQLite
over the `events_site_ts` range (site_id, ts) and the `sessions_site_start` range
(site_id, started_at), so a report reads only its site's rows of its dates. Money is
read as the stored decimal text and added up with Decimal in Python: SQLite would sum
it as binary floats.
"""

from __future__ import annotations

import sqlite3
from datetime import date
from decimal import Decimal

from reports.mrr import Observation, SubscriptionHistory, SubscriptionPayment, mrr_at, mrr_movements
from reports.params import DateRange, end_of_day_ms
from reports.revenue import UNATTRIBUTED, PaymentRow, revenue_by_currency
from reports.traffic import BreakdownCount, SessionTotals, breakdown_rows, traffic_aggregate

IDENTIFY = "$identify"
PAGEVIEW = "pageview"

# A customer's first-touch channel is the session customer_first_touch names (kept current
# by the attribution triggers in schema.sql); no row or no session means Unattributed.
_REVENUE_PAYMENTS = (
    "SELECT p.customer_id, p.kind, p.status, p.currency, p.amount, p.fee, fs.channel"
    " FROM payments p"
    " LEFT JOIN customer_first_touch ft ON ft.site_id = p.site_id AND ft.customer_id = p.customer_id"
    " LEFT JOIN sessions fs ON fs.id = ft.session_id"
    " WHERE p.site_id = ? AND p.paid_at_ms >= ? AND p.paid_at_ms < ? AND p.status = 'succeeded'"
)

_OBSERVATIONS = (
    "SELECT o.subscription_id, o.customer_id, o.currency, o.effective_at_ms, o.status, o.amount,"
    " o.interval, o.plan, o.started_at_ms, o.ended_at_ms, fs.channel"
    " FROM subscription_observations o"
    " LEFT JOIN customer_first_touch ft ON ft.site_id = o.site_id AND ft.customer_id = o.customer_id"
    " LEFT JOIN sessions fs ON fs.id = ft.session_id"
    " WHERE o.site_id = ? AND o.effective_at_ms < ?"
    " ORDER BY o.effective_at_ms, o.id"
)

# Fallback amounts, needed only for subscriptions observed without one.
_SUBSCRIPTION_CHARGES = (
    "SELECT p.subscription_id, p.currency, p.amount, p.paid_at_ms, p.kind, p.status"
    " FROM payments p"
    " WHERE p.site_id = ? AND p.paid_at_ms < ? AND p.kind = 'charge' AND p.status = 'succeeded'"
    " AND p.subscription_id IN (SELECT o.subscription_id FROM subscription_observations o"
    " WHERE o.site_id = ? AND o.amount IS NULL)"
    " ORDER BY p.paid_at_ms, p.id"
)

_EVENT_TOTALS = (
    "SELECT coalesce(sum(name = 'pageview'), 0), coalesce(sum(name <> 'pageview'), 0)"
    " FROM events WHERE site_id = ? AND ts >= ? AND ts < ? AND name <> '$identify'"
)

# Visitors are counted over sessions (a quarter of the rows of events, so half the time of
# a distinct count over events), and a visit that crosses midnight counts its visitor once
# although the daily salt gave it a second id.
_SESSION_TOTALS = (
    "SELECT count(DISTINCT visitor_id), count(*),"
    " coalesce(sum(pageviews = 1 AND custom_events = 0), 0),"
    " coalesce(sum(last_seen_at - started_at), 0)"
    " FROM sessions WHERE site_id = ? AND started_at >= ? AND started_at < ?"
)

# Dimensions read from each event, and those fixed by a session's first event.
EVENT_DIMENSIONS = {"page": "pathname", "country": "country", "device": "device",
                    "browser": "browser", "os": "os", "event": "name"}
SESSION_DIMENSIONS = {"channel": "channel", "source": "source", "entry_page": "entry_path"}


def _event_breakdown_sql(column: str) -> str:
    # sql-safe: column comes from the fixed mapping EVENT_DIMENSIONS, values stay parameters
    return (
        f"SELECT {column}, count(DISTINCT visitor_id) AS visitors,"  # noqa: S608 - fixed column
        " sum(name = 'pageview'), sum(name <> 'pageview')"
        " FROM events WHERE site_id = ? AND ts >= ? AND ts < ? AND name <> '$identify'"
        + (" AND name <> 'pageview'" if column == "name" else "")
        + f" GROUP BY {column}"  # sql-safe: fixed column from EVENT_DIMENSIONS
        f" ORDER BY visitors DESC, {column} IS NULL, {column} LIMIT ?"  # sql-safe: fixed column
    )


def _session_breakdown_sql(column: str) -> str:
    # sql-safe: column comes from the fixed mapping SESSION_DIMENSIONS, values stay parameters
    return (
        f"SELECT {column}, count(DISTINCT visitor_id) AS visitors,"  # noqa: S608 - fixed column
        " sum(pageviews), sum(custom_events)"
        " FROM sessions WHERE site_id = ? AND started_at >= ? AND started_at < ?"
        f" GROUP BY {column}"  # sql-safe: fixed column from SESSION_DIMENSIONS
        f" ORDER BY visitors DESC, {column} IS NULL, {column} LIMIT ?"  # sql-safe: fixed column
    )


BREAKDOWN_SQL = {
    **{by: _event_breakdown_sql(column) for by, column in EVENT_DIMENSIONS.items()},
    **{by: _session_breakdown_sql(column) for by, column in SESSION_DIMENSIONS.items()},
}


def _decimal(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)


def revenue(conn: sqlite3.Connection, site_id: int, period: DateRange) -> dict:
    rows, channels = [], {}
    for customer, kind, status, currency, amount, fee, channel in conn.execute(
            _REVENUE_PAYMENTS, (site_id, period.start_ms, period.end_ms)):
        rows.append(PaymentRow(customer, kind, status, currency, Decimal(amount), _decimal(fee)))
        channels[customer] = channel or UNATTRIBUTED
    return {"from": period.start.isoformat(), "to": period.end.isoformat(),
            "currencies": revenue_by_currency(rows, channels)}


def subscription_history(conn: sqlite3.Connection, site_id: int,
                         before_ms: int) -> tuple[SubscriptionHistory, dict[str, str]]:
    """Every observation and fallback charge dated before the instant, and the customers'
    channels."""
    observations, channels = [], {}
    rows = conn.execute(_OBSERVATIONS, (site_id, before_ms))
    for seq, (sub_id, customer, currency, effective_at, status, amount, interval, plan,
              started_at, ended_at, channel) in enumerate(rows):
        observations.append(Observation(
            sub_id, customer, currency, effective_at, status, _decimal(amount), interval, plan,
            started_at, ended_at, seq))
        channels[customer] = channel or UNATTRIBUTED
    payments = [
        SubscriptionPayment(sub_id, currency, Decimal(amount), paid_at, kind, status, seq)
        for seq, (sub_id, currency, amount, paid_at, kind, status) in enumerate(
            conn.execute(_SUBSCRIPTION_CHARGES, (site_id, before_ms, site_id)))
    ]
    return SubscriptionHistory(observations, payments), channels


def mrr(conn: sqlite3.Connection, site_id: int, at: date) -> dict:
    history, channels = subscription_history(conn, site_id, end_of_day_ms(at))
    return {"at": at.isoformat(), "currencies": mrr_at(history, at, channels)}


def movements(conn: sqlite3.Connection, site_id: int, period: DateRange) -> dict:
    history, _ = subscription_history(conn, site_id, period.end_ms)
    return {"from": period.start.isoformat(), "to": period.end.isoformat(),
            "currencies": mrr_movements(history, period)}


def aggregate(conn: sqlite3.Connection, site_id: int, period: DateRange) -> dict:
    bounds = (site_id, period.start_ms, period.end_ms)
    pageviews, events = conn.execute(_EVENT_TOTALS, bounds).fetchone()
    visitors, sessions, bounces, duration_ms = conn.execute(_SESSION_TOTALS, bounds).fetchone()
    totals = SessionTotals(visitors, pageviews, sessions, events, bounces, duration_ms)
    return {"from": period.start.isoformat(), "to": period.end.isoformat(),
            **traffic_aggregate(totals)}


def breakdown(conn: sqlite3.Connection, site_id: int, period: DateRange, by: str,
              limit: int) -> dict:
    rows = conn.execute(BREAKDOWN_SQL[by], (site_id, period.start_ms, period.end_ms, limit))
    counts = [BreakdownCount(value, visitors, pageviews or 0, events or 0)
              for value, visitors, pageviews, events in rows]
    return {"from": period.start.isoformat(), "to": period.end.isoformat(), "by": by,
            "rows": breakdown_rows(counts, limit)}

