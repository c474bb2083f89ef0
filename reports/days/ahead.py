"""Final days counted ahead of the reports, by a background duty (app.py's list).

A report reads a final day's figures from traffic_days / traffic_day_values once a report
has counted it; the first report over a long range counts every day it finds unstored, and
on a large site that first count can need more than a read's budget (TALLY_READ_BUDGET:
422 `query_too_expensive`, progress kept a week at a time). Counting each site's recent
final days in the background, a read at a time and after the owners' own reads, means
the dashboard, shared links and the Stats API find them stored: their first look costs what
a repeat does. Only the unfiltered figures are counted ahead (the totals and each
breakdown of reports/days/queries.DIMENSIONS); filtered segments are counted when asked.
"""

from __future__ import annotations

import datetime as dt

from reports.days.queries import DIMENSIONS
from reports.days.traffic_days import TrafficDays
from reports.shared.params import DateRange
from storage.db import Database

AHEAD_DAYS = 31  # the dashboard's and the Stats API's month ranges
BREAKDOWNS = (None, *DIMENSIONS)  # None: the day's totals


def store_final_days(db: Database, site_id: int, now: float, by: str | None) -> None:
    """Count and store the site's final days among the last AHEAD_DAYS not stored yet: the
    totals (`by` None) or one breakdown. Two days back is the newest a day can be final
    (reports/days/traffic_days.py); a day with a session still open is left for later."""
    today = dt.datetime.fromtimestamp(now, dt.UTC).date()
    period = DateRange(today - dt.timedelta(days=AHEAD_DAYS), today - dt.timedelta(days=2))
    traffic = TrafficDays(db, site_id, int(now * 1000))
    if by is None:
        traffic.day_totals(period)
    else:
        traffic.values(period, by)
