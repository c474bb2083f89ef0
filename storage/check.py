"""`tally check`: is the database sound, and does every account's monthly usage match
the events stored?

Usage is counted in the month an event was *received*; an event stores its own `ts`,
which the events endpoint keeps only within one hour before and one minute after the
receipt. So an event whose ts lies within that distance of a month boundary may be
counted in the neighbouring month. The check is therefore exact per account over all
months, and exact per month up to those boundary events (zero on a database whose
traffic does not straddle a month change).
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field

from storage import deadletters
from vocabulary import IDENTIFY, TS_FUTURE_MS, TS_PAST_MS

UNCOUNTED_EVENTS = (IDENTIFY,)

# Counted events per account and UTC month of ts, with the boundary events that may
# have been received (so counted) in the month before or after.
EVENTS_BY_MONTH = """
SELECT s.account_id,
       strftime('%Y-%m', e.ts / 1000, 'unixepoch') AS month,
       count(*),
       sum(e.ts < (unixepoch(e.ts / 1000, 'unixepoch', 'start of month') * 1000 + ?)),
       sum(e.ts >= (unixepoch(e.ts / 1000, 'unixepoch', 'start of month', '+1 month') * 1000 - ?))
  FROM events e JOIN sites s ON s.id = e.site_id
 WHERE e.name <> ?
 GROUP BY s.account_id, month
"""
USAGE = "SELECT account_id, month, events FROM monthly_usage"
# Counted events deleted by retention or erasure (storage/maintenance.py), same columns.
DELETED = "SELECT account_id, month, events, early, late FROM deleted_events"
ACCOUNT_IDS = "SELECT id, public_id FROM accounts"
TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('events', 'monthly_usage')"


@dataclass
class CheckReport:
    integrity: list[str] = field(default_factory=list)  # problems; empty when sound
    foreign_keys: int = 0
    usage_checked: bool = False
    months: int = 0
    mismatches: list[dict] = field(default_factory=list)
    # Accepted events set aside by the flush (storage/deadletters.py). They are reported,
    # not a failure of the check: the database is sound and the usage matches without them.
    dead_letters: int = 0

    @property
    def ok(self) -> bool:
        return not self.integrity and not self.foreign_keys and not self.mismatches

    def as_json(self) -> dict:
        return {
            "ok": self.ok,
            "integrity": "ok" if not self.integrity else self.integrity,
            "foreign_key_violations": self.foreign_keys,
            "usage": {"checked": self.usage_checked, "months": self.months,
                      "mismatches": self.mismatches},
            "dead_letters": self.dead_letters,
        }


def run_checks(conn: sqlite3.Connection) -> CheckReport:
    report = CheckReport()
    rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    report.integrity = [] if rows == ["ok"] else rows
    report.foreign_keys = len(conn.execute("PRAGMA foreign_key_check").fetchall())
    if report.integrity:
        return report
    report.dead_letters = deadletters.count(conn) or 0
    if {r[0] for r in conn.execute(TABLES)} == {"events", "monthly_usage"}:
        report.usage_checked = True
        report.mismatches, report.months = usage_mismatches(conn)
    return report


def usage_mismatches(conn: sqlite3.Connection) -> tuple[list[dict], int]:
    stored: dict[tuple[int, str], int] = {}
    may_leave_early: dict[tuple[int, str], int] = {}  # could be counted in the month before
    may_leave_late: dict[tuple[int, str], int] = {}  # could be counted in the month after
    for account, month, count, early, late in conn.execute(
        EVENTS_BY_MONTH, (TS_FUTURE_MS, TS_PAST_MS, *UNCOUNTED_EVENTS)
    ):
        stored[(account, month)] = count
        may_leave_early[(account, month)] = early
        may_leave_late[(account, month)] = late
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'deleted_events'").fetchone():
        for account, month, count, early, late in conn.execute(DELETED):
            key = (account, month)
            stored[key] = stored.get(key, 0) + count
            may_leave_early[key] = may_leave_early.get(key, 0) + early
            may_leave_late[key] = may_leave_late.get(key, 0) + late
    usage = {(account, month): events for account, month, events in conn.execute(USAGE)}
    names = dict(conn.execute(ACCOUNT_IDS).fetchall())

    mismatches = []
    totals_stored: dict[int, int] = defaultdict(int)
    totals_usage: dict[int, int] = defaultdict(int)
    for key in sorted(stored.keys() | usage.keys()):
        account, month = key
        events, counted = stored.get(key, 0), usage.get(key, 0)
        totals_stored[account] += events
        totals_usage[account] += counted
        low = events - may_leave_early.get(key, 0) - may_leave_late.get(key, 0)
        high = (events + may_leave_late.get((account, _shift(month, -1)), 0)
                + may_leave_early.get((account, _shift(month, 1)), 0))
        if not low <= counted <= high:
            mismatches.append({"account": names.get(account, account), "month": month,
                               "usage": counted, "events": events})
    for account in sorted(totals_stored.keys() | totals_usage.keys()):
        if totals_stored[account] != totals_usage[account]:
            mismatches.append({"account": names.get(account, account), "month": "all",
                               "usage": totals_usage[account], "events": totals_stored[account]})
    return mismatches, len(stored.keys() | usage.keys())


def _shift(month: str, by: int) -> str:
    year, number = int(month[:4]), int(month[5:7]) - 1 + by
    return f"{year + number // 12:04d}-{number % 12 + 1:02d}"
