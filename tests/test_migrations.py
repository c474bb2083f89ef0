"""Version 9 loosened subscription_observations.payment_id and subscriptions.payment_id
(subscription states known without a payment): a version-8 file is rebuilt in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from storage.db import Database, schema
from tests.conftest import rows

FIXTURE = Path(__file__).resolve().parent / "data" / "tally-v8.db"  # see tests/test_upgrade.py


@pytest.mark.sqlite_only  # a version-8 SQLite file rebuilt in place
def test_version_8_subscriptions_move_to_optional_payment_ids(tmp_path):
    path = str(tmp_path / "old.db")
    shutil.copyfile(FIXTURE, path)
    observed = rows(path, "SELECT payment_id, subscription_id, amount, effective_at_ms"
                          " FROM subscription_observations")
    latest = rows(path, "SELECT payment_id, subscription_id, status FROM subscriptions")
    assert len(observed) == len(latest) == 1

    Database(path).check_startup()

    assert rows(path, "PRAGMA user_version") == [{"user_version": schema()[0]}]
    assert rows(path, "SELECT payment_id, subscription_id, amount, effective_at_ms"
                      " FROM subscription_observations") == observed
    assert rows(path, "SELECT event_id FROM subscription_observations") == [{"event_id": None}]
    assert rows(path, "SELECT payment_id, subscription_id, status FROM subscriptions") == latest
    for table in ("subscription_observations", "subscriptions"):
        columns = {r["name"]: r["notnull"] for r in rows(
            path, "SELECT name, \"notnull\" FROM pragma_table_info(?)", (table,))}
        assert columns["payment_id"] == 0
    indexes = {r["name"] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"subscription_observations_sub", "subscription_observations_time",
            "subscription_observations_event", "subscriptions_customer"} <= indexes
    assert not [r for r in rows(path, "SELECT name FROM sqlite_master") if "before_9" in r["name"]]
    assert rows(path, "PRAGMA foreign_key_check") == []
    # Opening again changes nothing.
    Database(path).check_startup()
    assert rows(path, "SELECT payment_id FROM subscription_observations") == [
        {"payment_id": observed[0]["payment_id"]}]
