"""Does every account's monthly usage match the events stored (`tally check`)?

Usage is counted in the month an event was *received*; an event stores its own `ts`,
which the events endpoint keeps only within TS_PAST_MS before and TS_FUTURE_MS after the
receipt. So an event whose ts lies within that distance of a month boundary may be
counted in the neighbouring month. The check is therefore exact per account over all
months, and exact per month up to those boundary events (zero on a database whose
traffic does not straddle a month change).
"""

from __future__ import annotations

from collections import defaultdict

from storage.check import (
    account_public_ids,
    deleted_by_month,
    events_by_month,
    usage_by_month,
)
from storage.connection import Connection
from vocabulary import TS_FUTURE_MS, TS_PAST_MS, UNCOUNTED_EVENTS


def usage_mismatches(conn: Connection) -> tuple[list[dict], int]:
    """(mismatches, account-months checked) between monthly_usage and the stored events."""
    stored: dict[tuple[int, str], int] = {}
    may_leave_early: dict[tuple[int, str], int] = {}  # could be counted in the month before
    may_leave_late: dict[tuple[int, str], int] = {}  # could be counted in the month after
    for account, month, count, early, late in events_by_month(
            conn, UNCOUNTED_EVENTS, TS_FUTURE_MS, TS_PAST_MS):
        stored[(account, month)] = count
        may_leave_early[(account, month)] = early
        may_leave_late[(account, month)] = late
    for account, month, count, early, late in deleted_by_month(conn):
        key = (account, month)
        stored[key] = stored.get(key, 0) + count
        may_leave_early[key] = may_leave_early.get(key, 0) + early
        may_leave_late[key] = may_leave_late.get(key, 0) + late
    usage = usage_by_month(conn)
    names = account_public_ids(conn)

    mismatches = []
    totals_stored: dict[int, int] = defaultdict(int)
    totals_usage: dict[int, int] = defaultdict(int)
    for key in sorted(stored.keys() | usage.keys()):
        account, month = key
        events, counted = stored.get(key, 0), usage.get(key, 0)
        totals_stored[account] += events
        totals_usage[account] += counted
        low = events - may_leave_early.get(key, 0) - may_leave_late.get(key, 0)
        high = (events + may_leave_late.get((account, shift_month(month, -1)), 0)
                + may_leave_early.get((account, shift_month(month, 1)), 0))
        if not low <= counted <= high:
            mismatches.append({"account": names.get(account, account), "month": month,
                               "usage": counted, "events": events})
    for account in sorted(totals_stored.keys() | totals_usage.keys()):
        if totals_stored[account] != totals_usage[account]:
            mismatches.append({"account": names.get(account, account), "month": "all",
                               "usage": totals_usage[account], "events": totals_stored[account]})
    return mismatches, len(stored.keys() | usage.keys())


def shift_month(month: str, by: int) -> str:
    """The "YYYY-MM" `by` months after (before, when negative) `month`."""
    year, number = int(month[:4]), int(month[5:7]) - 1 + by
    return f"{year + number // 12:04d}-{number % 12 + 1:02d}"
