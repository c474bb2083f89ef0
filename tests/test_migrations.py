"""A database written by an earlier schema opens with the current one, its rows kept."""

from __future__ import annotations

import sqlite3

from storage.db import Database, _statements, schema
from tests.conftest import REPO, rows

# schema.sql as it was at version 8 (commit 31677c1), before subscription states without
# a payment.
SCHEMA_8 = REPO / "tests" / "data" / "schema-8.sql"


def test_version_8_subscriptions_move_to_optional_payment_ids(tmp_path):
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for statement in _statements(SCHEMA_8.read_text()):
        conn.execute(statement)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 8
    conn.executescript("""
        INSERT INTO accounts (id, public_id, name, created_at) VALUES (1, 'acct_1', 'A', 0);
        INSERT INTO sites (id, public_id, account_id, created_at) VALUES (1, 'site_1', 1, 0);
        INSERT INTO customers (site_id, customer_id, as_of_ms, created_at, updated_at)
            VALUES (1, 'cus_1', 0, 0, 0);
        INSERT INTO payments (site_id, payment_id, customer_id, amount, currency, kind, status,
            paid_at, paid_at_ms, subscription_id, created_at, updated_at)
            VALUES (1, 'pay_1', 'cus_1', '20', 'USD', 'charge', 'succeeded',
                    '2026-09-01T00:00:00Z', 1788220800000, 'sub_1', 0, 0);
        INSERT INTO subscription_observations (site_id, payment_id, subscription_id, customer_id,
            effective_at_ms, currency, status, amount, started_at, started_at_ms, received_at)
            VALUES (1, 'pay_1', 'sub_1', 'cus_1', 1788220800000, 'USD', 'active', '20',
                    '2026-09-01T00:00:00Z', 1788220800000, 0);
        INSERT INTO subscriptions (site_id, subscription_id, customer_id, payment_id,
            effective_at_ms, currency, status, amount, started_at, started_at_ms, updated_at)
            VALUES (1, 'sub_1', 'cus_1', 'pay_1', 1788220800000, 'USD', 'active', '20',
                    '2026-09-01T00:00:00Z', 1788220800000, 0);
    """)
    conn.close()

    Database(path).check_startup()

    assert rows(path, "PRAGMA user_version") == [{"user_version": schema()[0]}]
    assert rows(path, "SELECT payment_id, event_id, amount FROM subscription_observations") == [
        {"payment_id": "pay_1", "event_id": None, "amount": "20"}]
    assert rows(path, "SELECT payment_id, status FROM subscriptions") == [
        {"payment_id": "pay_1", "status": "active"}]
    columns = {r["name"]: r["notnull"] for r in rows(path, "PRAGMA table_info(subscription_observations)")}
    assert columns["payment_id"] == 0 and "event_id" in columns
    indexes = {r["name"] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"subscription_observations_sub", "subscription_observations_time",
            "subscription_observations_event", "subscriptions_customer"} <= indexes
    assert not [r for r in rows(path, "SELECT name FROM sqlite_master") if "before_9" in r["name"]]
    assert rows(path, "PRAGMA foreign_key_check") == []
