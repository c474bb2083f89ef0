"""Before raw traffic is deleted, the figures of its days are stored (reports/days/traffic_days.py), so
traffic reports over pruned days keep answering from the stored final days."""

from __future__ import annotations

from datetime import date, timedelta

from reports.days.queries import DIMENSIONS
from reports.days.traffic_days import FINAL_DELAY_MS, TrafficDays
from reports.shared.params import DateRange, day_start_ms
from storage.db import Database

EPOCH = date(1970, 1, 1)


def earliest_allowed_cutoff(now_ms: int) -> date:
    """The latest --before whose earlier days are all final (none can still change)."""
    return EPOCH + timedelta(days=(now_ms - FINAL_DELAY_MS) // 86_400_000)


def store_days(db: Database, site_id: int, days: list[int], now_ms: int) -> None:
    """Compute and store the totals and every breakdown of these (final) days."""
    if not days:
        return
    period = DateRange(EPOCH + timedelta(days=min(days)), EPOCH + timedelta(days=max(days)))
    traffic = TrafficDays(db, site_id, now_ms)
    traffic.totals(period)
    for by in DIMENSIONS:
        traffic.values(period, by)


def cutoff_ms(before: date) -> int:
    return day_start_ms(before)
