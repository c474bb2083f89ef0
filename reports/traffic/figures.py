"""Traffic figures: the aggregate of a date range and breakdowns by one dimension.

SQL does the counting (reports.days.queries); these functions give the counts their
public shape, so the rules for ratios, rounding and ordering live in one place.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import NamedTuple

from reports.money.amounts import round_half_up


class SessionTotals(NamedTuple):
    """Counts over the events dated in the range and the sessions that started in it."""

    visitors: int = 0  # distinct visitor ids of those sessions
    pageviews: int = 0
    sessions: int = 0
    events: int = 0  # custom events, never $identify
    bounces: int = 0  # sessions with one pageview and no custom event
    duration_ms: int = 0  # sum over sessions of last event - first event


class BreakdownCount(NamedTuple):
    value: str | None
    visitors: int
    pageviews: int
    events: int


def traffic_aggregate(totals: SessionTotals) -> dict:
    """bounce_rate is a ratio from 0 to 1 with four decimals; avg_session_seconds has one.
    Both are rounded half up from the exact ratio, and are 0 without sessions."""
    sessions = totals.sessions
    return {
        "visitors": totals.visitors,
        "pageviews": totals.pageviews,
        "sessions": sessions,
        "events": totals.events,
        "bounce_rate": _rounded(Fraction(totals.bounces, sessions), 4) if sessions else 0.0,
        "avg_session_seconds":
            _rounded(Fraction(totals.duration_ms, sessions * 1000), 1) if sessions else 0.0,
    }


def _rounded(value: Fraction, places: int) -> float:
    return round_half_up(value * 10**places) / 10**places


def breakdown_rows(counts: Iterable[BreakdownCount], limit: int) -> list[dict]:
    """Rows sorted by visitors (most first), then value (A to Z, a missing value last)."""
    ordered = sorted(counts, key=lambda c: (-c.visitors, c.value is None, c.value or ""))
    return [
        {"value": c.value, "visitors": c.visitors, "pageviews": c.pageviews, "events": c.events}
        for c in ordered[:limit]
    ]
