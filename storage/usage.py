"""monthly_usage: counted events per account and UTC month, and how many of them were
anonymous (POST /api/v1/collect).

The flush adds to it in the transaction that stores the events; quota/ holds the
arithmetic (plans, caps, what a worker holds but has not stored).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from storage.statements import statement

_READ = statement("SELECT events, anonymous FROM monthly_usage WHERE account_id = ? AND month = ?")
_ACCOUNT_MONTH = statement(
    "SELECT a.plan, COALESCE(u.events, 0), COALESCE(u.anonymous, 0) FROM accounts a"
    " LEFT JOIN monthly_usage u ON u.account_id = a.id AND u.month = ?"
    " WHERE a.public_id = ?"
)


def read_usage(conn: sqlite3.Connection, account_id: int, month: str) -> tuple[int, int]:
    """(counted events, the anonymous ones among them) of the account in the month."""
    row = conn.execute(_READ, (account_id, month)).fetchone()
    return (row[0], row[1]) if row else (0, 0)


def account_month(conn: sqlite3.Connection, account_public_id: str,
                  month: str) -> tuple[str, int, int] | None:
    """(plan, counted events, anonymous ones) of the account in the month; None when no
    such account."""
    return conn.execute(_ACCOUNT_MONTH, (month, account_public_id)).fetchone()


ADD_USAGE = statement(
    "INSERT INTO monthly_usage (account_id, month, events, anonymous) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (account_id, month) DO UPDATE SET events = monthly_usage.events + excluded.events,"
    " anonymous = monthly_usage.anonymous + excluded.anonymous"
    " RETURNING events, anonymous"
)


def add_usage(conn: sqlite3.Connection, usage: dict[tuple[int, str], int],
              anonymous: dict[tuple[int, str], int] | None = None,
              ) -> Callable[[], dict[tuple[int, str], tuple[int, int]]]:
    """Add counted events per (account id, month), `anonymous` of them anonymous; returns
    a function that reads each one's new (total, anonymous): the flush sends these in a
    pipeline on PostgreSQL (ingest/pipeline.py) and reads them once it has ended. The
    flush calls it in the transaction that stores those events, so the two always agree."""
    anonymous = anonymous or {}
    # In key order: two PostgreSQL flushes adding to the same accounts lock their rows in
    # the same order, so neither waits for the other in a cycle.
    sent = [(key, conn.execute(ADD_USAGE, (*key, usage[key], anonymous.get(key, 0))))
            for key in sorted(usage)]
    return lambda: {key: tuple(cursor.fetchone()) for key, cursor in sent}
