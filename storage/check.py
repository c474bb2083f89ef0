"""`tally check`: is the database sound, and does every account's monthly usage match
the events stored? The integrity checks and the usage readers are here; the usage
arithmetic (which months an event may have been counted in) is quota.audit's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson

from storage import deadletters
from storage.dialect import counted_by_month, dialect
from storage.statements import by_dialect, native, postgres_spelling, statement

# Counted events per account and UTC month of ts, with the boundary events that may
# have been received (so counted) in the month before or after. Every anonymous event
# counts; a keyed one unless its name is uncounted.
_EVENTS_BY_MONTH = """
SELECT s.account_id, {counted}
  FROM events e JOIN sites s ON s.id = e.site_id
 WHERE (e.name NOT IN (SELECT value FROM json_each(?)) OR e.anonymous = 1)
 GROUP BY s.account_id, month
"""
EVENTS_BY_MONTH = by_dialect(**{name: _EVENTS_BY_MONTH.format(counted=counted_by_month(name))
                                for name in ("sqlite", "postgres")})
USAGE = statement("SELECT account_id, month, events FROM monthly_usage")
# Counted events deleted by retention or erasure (storage/maintenance.py), same columns.
DELETED = statement("SELECT account_id, month, events, early, late FROM deleted_events")
ACCOUNT_IDS = statement("SELECT id, public_id FROM accounts")
TABLES = by_dialect(
    sqlite="SELECT name FROM sqlite_master WHERE type = 'table'",
    postgres="SELECT table_name FROM information_schema.tables"
             " WHERE table_schema = current_schema()",
)

POSTGRES_INVALID_INDEXES = native("postgres",
    """
    SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace = current_schema()::regnamespace AND NOT (i.indisvalid AND i.indisready)
 ORDER BY c.relname
""")
# One query per foreign key of Tally's schema, counting the rows whose key has no parent
# (MATCH SIMPLE: a key with a NULL column refers to nothing). PostgreSQL quotes the names.
POSTGRES_FOREIGN_KEY_CHECKS = native("postgres",
    """
    SELECT format('SELECT count(*) FROM %s AS child WHERE %s AND NOT EXISTS'
    ' (SELECT 1 FROM %s AS parent WHERE %s)',
    k.conrelid::regclass, string_agg(format('child.%I IS NOT NULL', ca.attname), ' AND '),
    k.confrelid::regclass,
    string_agg(format('parent.%I = child.%I', pa.attname, ca.attname), ' AND '))
  FROM pg_constraint k
 CROSS JOIN LATERAL unnest(k.conkey, k.confkey) AS pair (child_column, parent_column)
  JOIN pg_attribute ca ON ca.attrelid = k.conrelid AND ca.attnum = pair.child_column
  JOIN pg_attribute pa ON pa.attrelid = k.confrelid AND pa.attnum = pair.parent_column
 WHERE k.contype = 'f' AND k.connamespace = current_schema()::regnamespace
 GROUP BY k.oid, k.conrelid, k.confrelid
 ORDER BY k.oid
""")

# schema.sql's references that PostgreSQL's schema leaves to the flush (schema_postgres.sql,
# "Checked by the flush"): (child table, column, parent table, column). Counted as its
# foreign keys are.
FLUSH_CHECKED_REFERENCES = (
    ("events", "site_id", "sites", "id"),
    ("sessions", "site_id", "sites", "id"),
    ("session_visitors", "site_id", "sites", "id"),
    ("session_visitors", "session_id", "sessions", "id"),
)
_ORPHANS = ("SELECT count(*) FROM {0} AS child WHERE child.{1} IS NOT NULL"
            " AND NOT EXISTS (SELECT 1 FROM {2} AS parent WHERE parent.{3} = child.{1})")
_FLUSH_CHECKED_ORPHANS = {reference: native("postgres", _ORPHANS.format(*reference))
                          for reference in FLUSH_CHECKED_REFERENCES}  # fixed names, above

_INTEGRITY_CHECK = native("sqlite", "PRAGMA integrity_check")
_FOREIGN_KEY_CHECK = native("sqlite", "PRAGMA foreign_key_check")


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


UsageCheck = Callable[[sqlite3.Connection], tuple[list[dict], int]]


def run_checks(conn: sqlite3.Connection, usage_mismatches: UsageCheck) -> CheckReport:
    """usage_mismatches: quota.audit.usage_mismatches (mismatches, account-months checked)."""
    report = CheckReport()
    if dialect(conn) == "sqlite":
        rows = [r[0] for r in conn.execute(_INTEGRITY_CHECK)]
        report.integrity = [] if rows == ["ok"] else rows
        report.foreign_keys = len(conn.execute(_FOREIGN_KEY_CHECK).fetchall())
    else:
        # PostgreSQL checks its own pages (data checksums): a server whose storage is damaged
        # fails the queries below. What it can leave behind is an index a failed (concurrent)
        # build or reindex left unusable, and rows written with triggers disabled.
        report.integrity = [f"index {name} is invalid"
                            for (name,) in conn.execute(POSTGRES_INVALID_INDEXES)]
        report.foreign_keys = sum(conn.execute(postgres_spelling(query)).fetchone()[0]
                                  for (query,) in conn.execute(POSTGRES_FOREIGN_KEY_CHECKS))
        report.foreign_keys += sum(conn.execute(query).fetchone()[0]
                                   for query in _FLUSH_CHECKED_ORPHANS.values())
    if report.integrity:
        return report
    report.dead_letters = deadletters.count(conn) or 0
    if {"events", "monthly_usage"} <= tables(conn):
        report.usage_checked = True
        report.mismatches, report.months = usage_mismatches(conn)
    return report


def events_by_month(conn: sqlite3.Connection, uncounted: Iterable[str], early_ms: int,
                    late_ms: int) -> Iterator[tuple[int, str, int, int, int]]:
    """(account id, "YYYY-MM" of ts, events, those within early_ms after the month's start,
    those within late_ms before its end) over the counted events: the anonymous ones, and
    the keyed ones whose name is not uncounted."""
    return conn.execute(EVENTS_BY_MONTH[dialect(conn)],
                        (early_ms, late_ms, orjson.dumps(list(uncounted)).decode()))


def tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute(TABLES[dialect(conn)])}


def deleted_by_month(conn: sqlite3.Connection) -> list[tuple[int, str, int, int, int]]:
    """The same counts for events deleted by `tally prune` (deleted_events), if any."""
    if "deleted_events" in tables(conn):
        return conn.execute(DELETED).fetchall()
    return []


def usage_by_month(conn: sqlite3.Connection) -> dict[tuple[int, str], int]:
    return {(account, month): events for account, month, events in conn.execute(USAGE)}


def account_public_ids(conn: sqlite3.Connection) -> dict[int, str]:
    return dict(conn.execute(ACCOUNT_IDS).fetchall())
