"""The SQL behind revenue, MRR and its movements, revenue over time and goals: read a
site's rows, hand them to the pure functions.

Every statement is parameterized. Money is read as the stored decimal text and added up
with Decimal in Python: SQLite would sum it as binary floats. Customers are selected by
their first touch in Python (reports.segments.filters.touch_matches), over one row per
customer read here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import date
from decimal import Decimal

import orjson

from reports.money.mrr import (
    Observation,
    SubscriptionHistory,
    SubscriptionPayment,
    SubscriptionState,
    mrr_at,
    mrr_movements,
)
from reports.money.mrr_series import values_at_instants
from reports.money.revenue import PaymentRow, RevenuePayment, revenue_by_currency
from reports.shared.params import DateRange, end_of_day_ms
from storage.connection import Connection
from storage.dialect import dialect
from storage.sessions import first_touch_join, linked_customers, linked_sessions
from storage.statements import by_dialect, statement
from vocabulary import UNATTRIBUTED

# A customer's first-touch channel is that of its first-touch session (storage.sessions);
# no such session means Unattributed.
# Payments alike (same customer, kind, currency, amount and fee: a subscription's monthly
# charges) come as one row with their count, so Python adds up far fewer rows. The channel
# is the customer's, so grouping by it too adds no row.
_REVENUE_PAYMENTS = statement(
    "SELECT p.customer_id, p.kind, p.currency, p.amount, p.fee, count(*), fs.channel"  # noqa: S608 - fixed alias
    " FROM payments p"
    + first_touch_join("p")  # sql-safe: a fixed alias
    + " WHERE p.site_id = ? AND p.paid_at_ms >= ? AND p.paid_at_ms < ? AND p.status = 'succeeded'"
    " GROUP BY p.customer_id, p.kind, p.currency, p.amount, p.fee, fs.channel"
)

# Each subscription's latest observation before an instant (on a tie, the one stored
# last: the subscriptions table keeps the same order), found by a seek per subscription in
# subscription_observations_sub, with its latest succeeded charge in that currency before
# the instant when it has no amount (payments_subscription, schema.sql's reports section).
_STATES_AT = statement(
    "SELECT o.subscription_id, o.customer_id, o.currency, o.status, o.amount, o.interval,"  # noqa: S608 - fixed alias
    " o.plan, o.started_at_ms, o.ended_at_ms,"
    " CASE WHEN o.amount IS NULL THEN ("
    "  SELECT p.amount FROM payments p"
    "   WHERE p.site_id = o.site_id AND p.subscription_id = o.subscription_id"
    "     AND p.currency = o.currency AND p.kind = 'charge' AND p.status = 'succeeded'"
    "     AND p.paid_at_ms < ?1"
    "   ORDER BY p.paid_at_ms DESC, p.id DESC LIMIT 1) END,"
    " fs.channel"
    " FROM subscriptions s"
    " JOIN subscription_observations o ON o.id = ("
    "  SELECT o2.id FROM subscription_observations o2"
    "   WHERE o2.site_id = s.site_id AND o2.subscription_id = s.subscription_id"
    "     AND o2.effective_at_ms < ?1"
    "   ORDER BY o2.effective_at_ms DESC, o2.id DESC LIMIT 1)"
    + first_touch_join("o")  # sql-safe: a fixed alias
    + " WHERE s.site_id = ?2"
    " AND (?3 IS NULL OR s.subscription_id IN (SELECT value FROM json_each(?3)))"
)

_CHANGED_BETWEEN = statement(
    "SELECT subscription_id FROM subscription_observations"
    " WHERE site_id = ?1 AND effective_at_ms >= ?2 AND effective_at_ms < ?3"
    " UNION"
    " SELECT subscription_id FROM payments"
    " WHERE site_id = ?1 AND paid_at_ms >= ?2 AND paid_at_ms < ?3"
    " AND subscription_id IS NOT NULL AND kind = 'charge' AND status = 'succeeded'"
)

# The whole history of the subscriptions some customers ever held (given as a JSON array),
# to find when each first had a positive monthly value.
_FIRST_OBSERVED = statement(
    "SELECT customer_id, currency, min(effective_at_ms) FROM subscription_observations"
    " WHERE site_id = ?1 AND customer_id IN (SELECT value FROM json_each(?2))"
    " GROUP BY customer_id, currency"
)

# The whole history of some subscriptions (given as a JSON array), to find when their
# customers first had a positive monthly value.
_CUSTOMERS_SUBSCRIPTIONS = statement(
    "SELECT DISTINCT subscription_id FROM subscription_observations"
    " WHERE site_id = ?1 AND customer_id IN (SELECT value FROM json_each(?2))"
)
_HISTORY_OBSERVATIONS = statement(
    "SELECT o.subscription_id, o.customer_id, o.currency, o.effective_at_ms, o.status, o.amount,"
    " o.interval, o.plan, o.started_at_ms, o.ended_at_ms"
    # CROSS JOIN keeps the list outermost: a seek per subscription, then one sort.
    " FROM json_each(?2) j CROSS JOIN subscription_observations o"
    " WHERE o.site_id = ?1 AND o.subscription_id = j.value"
    " ORDER BY o.effective_at_ms, o.id"
)
_HISTORY_CHARGES = statement(
    "SELECT p.subscription_id, p.currency, p.amount, p.paid_at_ms, p.kind, p.status"
    " FROM json_each(?2) j CROSS JOIN payments p"
    " WHERE p.site_id = ?1 AND p.subscription_id = j.value"
    " AND p.kind = 'charge' AND p.status = 'succeeded'"
    " ORDER BY p.paid_at_ms, p.id"
)

def _decimal(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)


def revenue(conn: Connection, site_id: int, period: DateRange) -> dict:
    rows, channels = [], {}
    for customer, kind, currency, amount, fee, count, channel in conn.execute(
            _REVENUE_PAYMENTS, (site_id, period.start_ms, period.end_ms)):
        rows.append(PaymentRow(customer, kind, "succeeded", currency, Decimal(amount),
                               _decimal(fee), count))
        channels[customer] = channel or UNATTRIBUTED
    return {"from": period.start.isoformat(), "to": period.end.isoformat(),
            "currencies": revenue_by_currency(rows, channels)}


class SqlSubscriptions:
    """A site's subscriptions read from SQLite (reports.money.mrr.SubscriptionSource)."""

    def __init__(self, conn: Connection, site_id: int):
        self.conn = conn
        self.site_id = site_id
        self.channels: dict[str, str] = {}  # customer -> first-touch channel, as states are read
        self._states: dict[int, list[SubscriptionState]] = {}  # all states, by instant

    def states_at(self, t: int,
                  subscription_ids: Collection[str] | None = None) -> list[SubscriptionState]:
        wanted = None if subscription_ids is None else orjson.dumps(sorted(subscription_ids))
        if wanted is None and t in self._states:
            return self._states[t]
        states = []
        for (sub_id, customer, currency, status, amount, interval, plan, started_at, ended_at,
             fallback, channel) in self.conn.execute(
                _STATES_AT, (t, self.site_id, wanted and wanted.decode())):
            states.append(SubscriptionState(
                sub_id, customer, currency, status, _decimal(amount), interval, plan,
                started_at, ended_at, _decimal(fallback)))
            self.channels[customer] = channel or UNATTRIBUTED
        if wanted is None:
            self._states[t] = states
        return states

    def changed_between(self, t0: int, t1: int) -> set[str]:
        return {row[0] for row in self.conn.execute(_CHANGED_BETWEEN, (self.site_id, t0, t1))}

    def first_positive(self, until: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        if not until:
            return {}
        customers = orjson.dumps(sorted({customer for _, customer in until})).decode()
        # Nothing is positive before its first observation: a key first observed at or after
        # its until - 1 is not positive before until (a new customer, the common case).
        first_seen = {(currency, customer): at for customer, currency, at in self.conn.execute(
            _FIRST_OBSERVED, (self.site_id, customers))}
        result = {key: first_seen[key] + 1 for key in until if key in first_seen}
        doubtful = {key[1] for key, before in until.items()
                    if key in first_seen and first_seen[key] + 1 < before}
        if not doubtful:
            return result
        subscriptions = [row[0] for row in self.conn.execute(
            _CUSTOMERS_SUBSCRIPTIONS, (self.site_id, orjson.dumps(sorted(doubtful)).decode()))]
        params = (self.site_id, orjson.dumps(subscriptions).decode())
        observations = [
            Observation(sub_id, customer, currency, at, status, _decimal(amount), interval, plan,
                        started_at, ended_at, seq)
            for seq, (sub_id, customer, currency, at, status, amount, interval, plan, started_at,
                      ended_at) in enumerate(self.conn.execute(_HISTORY_OBSERVATIONS, params))
        ]
        payments = [
            SubscriptionPayment(sub_id, currency, Decimal(amount), paid_at, kind, status, seq)
            for seq, (sub_id, currency, amount, paid_at, kind, status) in enumerate(
                self.conn.execute(_HISTORY_CHARGES, params))
        ]
        history = SubscriptionHistory(observations, payments)
        exact = {key: before for key, before in until.items() if key[1] in doubtful}
        for key in exact:
            result.pop(key, None)
        result.update(history.first_positive(exact))
        return result


def mrr(conn: Connection, site_id: int, at: date) -> dict:
    source = SqlSubscriptions(conn, site_id)
    source.states_at(end_of_day_ms(at))  # read now (kept), so the channels are known
    return {"at": at.isoformat(), "currencies": mrr_at(source, at, source.channels)}


def movements(conn: Connection, site_id: int, period: DateRange) -> dict:
    return {"from": period.start.isoformat(), "to": period.end.isoformat(),
            "currencies": mrr_movements(SqlSubscriptions(conn, site_id), period)}



# Each customer's first-touch session, and that session's first event (its earliest, a
# seek in events_site_ts at the session's start; $identify only when nothing else).
_FIRST_TOUCHES = statement(
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
_REVENUE_ROWS = statement(
    "SELECT customer_id, kind, currency, amount, fee, count(*) FROM payments"
    " WHERE site_id = ? AND paid_at_ms >= ? AND paid_at_ms < ? AND status = 'succeeded'"
    " GROUP BY customer_id, kind, currency, amount, fee"
)
# Succeeded payments dated in [t0, t1), alike ones grouped per bucket of `width` ms.
_PAYMENTS_BY_BUCKET = statement(
    "SELECT customer_id, kind, currency, amount, paid_at_ms / ?4 AS bucket, count(*)"
    " FROM payments WHERE site_id = ?1 AND paid_at_ms >= ?2 AND paid_at_ms < ?3"
    " AND status = 'succeeded'"
    " GROUP BY customer_id, kind, currency, amount, bucket"
)
_FIRST_CHARGES = statement(
    "SELECT customer_id, currency, min(paid_at_ms) FROM payments"
    " WHERE site_id = ? AND kind = 'charge' AND status = 'succeeded'"
    " GROUP BY customer_id, currency"
)
# Customers (given as a JSON array) with a succeeded charge.
_PAYING = statement(
    "SELECT DISTINCT customer_id FROM payments"
    " WHERE site_id = ?1 AND kind = 'charge' AND status = 'succeeded'"
    " AND customer_id IN (SELECT value FROM json_each(?2))"
)
# Each customer's plan: that of its subscription observed last.
_PLANS = statement(
    "SELECT customer_id, plan FROM subscriptions WHERE site_id = ?"
    " ORDER BY customer_id, effective_at_ms, id"
)


def first_touches(conn: Connection, site_id: int) -> dict[str, dict]:
    """customer id -> its first touch (TOUCH_FIELDS); customers without one are absent."""
    touches = {}
    for customer, *values in conn.execute(_FIRST_TOUCHES, (site_id,)):
        touch = dict(zip(TOUCH_FIELDS, values, strict=True))
        props = touch["props"]
        touch["props"] = orjson.loads(props) if props else {}
        touches[customer] = touch
    return touches


def payments_by_bucket(conn: Connection, site_id: int, t0: int, t1: int,
                       width: int) -> list[RevenuePayment]:
    return [RevenuePayment(customer, kind, currency, Decimal(amount), bucket * width, count)
            for customer, kind, currency, amount, bucket, count in conn.execute(
                _PAYMENTS_BY_BUCKET, (site_id, t0, t1, width))]


def first_charges(conn: Connection, site_id: int) -> dict[tuple[str, str], int]:
    return {(customer, currency): at for customer, currency, at in conn.execute(
        _FIRST_CHARGES, (site_id,))}


def paying_customers(conn: Connection, site_id: int, customers: list[str]) -> set[str]:
    if not customers:
        return set()
    wanted = orjson.dumps(sorted(customers)).decode()
    return {row[0] for row in conn.execute(_PAYING, (site_id, wanted))}


def plans(conn: Connection, site_id: int) -> dict[str, str | None]:
    return {customer: plan for customer, plan in conn.execute(_PLANS, (site_id,))}


def mrr_yearly_at(conn: Connection, site_id: int,
                  instants: list[int]) -> dict[int, dict[tuple[str, str], Decimal]]:
    """Each customer's yearly subscription value per currency at each instant."""
    if not instants:
        return {}
    return values_at_instants(SqlSubscriptions(conn, site_id), sorted(set(instants)))


def revenue_rows(conn: Connection, site_id: int, t0: int, t1: int) -> list[PaymentRow]:
    return [PaymentRow(customer, kind, "succeeded", currency, Decimal(amount),
                       None if fee is None else Decimal(fee), count)
            for customer, kind, currency, amount, fee, count in conn.execute(
                _REVENUE_ROWS, (site_id, t0, t1))]


# Customers linked now to a visitor id (customer.visitor_id, or user_id -> $identify) that
# did a custom event in [t0, t1): (event name, customer id). The linked visitors' sessions
# come from sessions_site_visitor and session_visitors (linked_sessions), and each
# session's events from a seek in events_site_ts over the session's own time span, so
# only the customers' visits are read, not the range.
_CONVERTED_CUSTOMERS = by_dialect(**{name: (
    f"WITH {linked_customers(name)}, {linked_sessions()}"  # noqa: S608 - fixed fragments
    " SELECT DISTINCT e.name, v.customer_id"
    " FROM visits v CROSS JOIN sessions s CROSS JOIN events e"
    " WHERE s.id = v.session_id"
    " AND e.site_id = ?1 AND e.ts >= max(s.started_at, ?2)"
    " AND e.ts <= min(s.last_seen_at, ?3 - 1) AND e.session_id = s.id"
    " AND s.last_seen_at >= ?2 AND s.started_at < ?3"
    " AND e.name <> 'pageview' AND e.name <> '$identify'"
) for name in ("sqlite", "postgres")})


def converted_customers(conn: Connection, site_id: int, t0: int,
                        t1: int) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for name, customer in conn.execute(_CONVERTED_CUSTOMERS[dialect(conn)],
                                        (site_id, t0, t1)):
        result.setdefault(name, set()).add(customer)
    return result
