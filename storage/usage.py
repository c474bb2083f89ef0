"""monthly_usage: counted events per account and UTC month.

The flush adds to it in the transaction that stores the events; quota/ holds the
arithmetic (plans, caps, what a worker holds but has not stored).
"""

from __future__ import annotations

import sqlite3

_READ = "SELECT events FROM monthly_usage WHERE account_id = ? AND month = ?"
_ACCOUNT_MONTH = (
    "SELECT a.plan, COALESCE(u.events, 0) FROM accounts a"
    " LEFT JOIN monthly_usage u ON u.account_id = a.id AND u.month = ?"
    " WHERE a.public_id = ?"
)


def read_usage(conn: sqlite3.Connection, account_id: int, month: str) -> int:
    row = conn.execute(_READ, (account_id, month)).fetchone()
    return row[0] if row else 0


def account_month(conn: sqlite3.Connection, account_public_id: str,
                  month: str) -> tuple[str, int] | None:
    """(plan, counted events) of the account in the month; None when no such account."""
    return conn.execute(_ACCOUNT_MONTH, (month, account_public_id)).fetchone()


ADD_USAGE = (
    "INSERT INTO monthly_usage (account_id, month, events) VALUES (?, ?, ?)"
    " ON CONFLICT (account_id, month) DO UPDATE SET events = monthly_usage.events + excluded.events"
    " RETURNING events"
)


def add_usage(conn: sqlite3.Connection,
              usage: dict[tuple[int, str], int]) -> dict[tuple[int, str], int]:
    """Add counted events per (account id, month); returns each one's new total. The flush
    calls it in the transaction that stores those events, so the two always agree."""
    return {key: conn.execute(ADD_USAGE, (*key, events)).fetchone()[0]
            for key, events in usage.items()}
